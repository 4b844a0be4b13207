"""Carrying the fence into the user's stack: SQLAlchemy (``integrations.sql``), Django,
Celery and OpenTelemetry. Each module imports its framework only when it is itself imported.
"""
