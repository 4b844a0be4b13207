"""Build script: compiles every Cython module under ``ext/`` into ``fencekit._redis``.

Each ``ext/<name>.pyx`` becomes the extension ``fencekit._redis.<name>``. The package
works without them (pure-Python fallbacks with byte-identical behaviour), so a
machine without a compiler or Cython gets a warning and a working install.

Environment switches:

- ``FENCEKIT_REQUIRE_EXT=1`` turns a failed or skipped build into an error
  (CI sets it, so a broken extension cannot hide behind the fallback).
- ``FENCEKIT_NO_EXT=1`` skips the extensions entirely (pure-Python install).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
REQUIRE = os.environ.get("FENCEKIT_REQUIRE_EXT", "") not in ("", "0")
SKIP = os.environ.get("FENCEKIT_NO_EXT", "") not in ("", "0")


def _fail_or_warn(message: str) -> None:
    if REQUIRE:
        raise SystemExit(f"fencekit: {message} (FENCEKIT_REQUIRE_EXT=1)")
    sys.stderr.write(f"WARNING fencekit: {message}; using the pure-Python fallback\n")


def _extensions() -> list[Extension]:
    if SKIP:
        return []
    sources = sorted((HERE / "ext").glob("*.pyx"))
    if not sources:
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _fail_or_warn("Cython is not installed")
        return []
    modules = [
        Extension(
            f"fencekit._redis.{src.stem}",
            [str(src.relative_to(HERE))],
            extra_compile_args=["-O3"],
            extra_link_args=["-s"],  # stripped: no debug symbols in what users install
        )
        for src in sources
    ]
    return list(
        cythonize(
            modules,
            language_level=3,
            compiler_directives={
                "boundscheck": False,
                "wraparound": False,
                "cdivision": True,
                "embedsignature": True,
            },
        )
    )


class OptionalBuildExt(build_ext):
    """``build_ext`` that degrades to the fallback unless the build is required."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # compiler missing, headers missing, ...
            _fail_or_warn(f"building the C extensions failed: {exc}")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _fail_or_warn(f"building {ext.name} failed: {exc}")


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
