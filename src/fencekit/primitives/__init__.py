"""The fencekit 0.1 primitives: canonical idempotency keys, IdempotencyGuard, DistributedLock, FenceGate.

Each primitive has a synchronous and an asyncio driver over one I/O-free
rules class, so both APIs decide everything the same way.
"""
