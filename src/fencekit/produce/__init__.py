"""Producing and operating: ``Client`` and ``SyncClient``, the enqueue path, queue handles,
bulk operations on dead and failed tasks, reading records and waiting for results.
"""
