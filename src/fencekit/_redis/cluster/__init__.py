"""Redis Cluster (private): the slot map and redirect rule (``routing``), reading the map from
the nodes (``maps``), the lean hot-path link over every primary (``link``), redis-py batches
split by node (``batches``) and sharded pub/sub that follows moved slots (``pubsub``).
"""
