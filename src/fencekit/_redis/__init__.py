"""The one Redis boundary (private): URLs, clients, error translation, keys, scripts, the hot path.

Nothing outside this package builds a redis-py client, spells a key or a
KEYS/ARGV position, or translates a redis-py exception. See ``docs/design.md``.
"""
