"""Durable settlements (``durable_replicas``): WAIT for replicas after a turn that settled tasks.

Scripts cannot ``WAIT`` themselves, so the consumer asks after the round
trip. A failover before the replicas have a settlement could undo it (the
task would run again): too few confirmations are a WARNING, never an error,
since the settlement itself landed.
"""

from __future__ import annotations

import logging

from fencekit._redis.link import Link, wait_replicas
from fencekit._redis.run import Durability
from fencekit.errors import StoreError

__all__ = ["confirm_settled"]


async def confirm_settled(link: Link, durable: Durability, logger: logging.Logger) -> None:
    """``WAIT`` for ``durable.replicas``; say so when fewer confirm in time or Redis fails."""
    try:
        confirmed = await wait_replicas(link, durable)
    except StoreError as exc:
        logger.warning("could not wait for %d replica(s) after settling tasks: %s", durable.replicas, exc)
        return
    if confirmed < durable.replicas:
        logger.warning(
            "settlements confirmed by %d of %d replica(s) within %d ms: a failover now could undo them "
            "(those tasks would run again)",
            confirmed,
            durable.replicas,
            durable.timeout_ms,
        )
