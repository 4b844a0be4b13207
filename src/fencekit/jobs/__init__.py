"""The job model, with no I/O of its own: tasks and their envelope, workers, task functions,
flow and periodic specifications, job records, the consumer registry and history buckets.

Everything above (``produce``, ``consume``, ``services``) builds on these types;
``docs/design.md`` draws the layers.
"""
