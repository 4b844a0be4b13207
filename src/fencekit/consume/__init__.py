"""Consuming: the consumer's loop and its turns (claim, ack), performing a job, settling it,
sync tasks' threads, cancels, and the wake-up of idle consumers.
"""
