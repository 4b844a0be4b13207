"""The job queue: tasks and their envelope, workers, the producer, the consumer and the maintenance loops.

The components here are placed in one process by ``fencekit.Server`` and split
over processes by ``fencekit.pool``; see ``docs/design.md`` for the path of one job.
"""
