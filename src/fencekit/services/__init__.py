"""The maintenance services a host runs beside its consumers: heartbeat, reaper, scheduler,
periodic ticker, history sampler and burst drain.

``fencekit.runtime.services`` assembles them for both placements (``Server`` and the pool's
supervisor).
"""
