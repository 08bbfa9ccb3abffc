"""`python -m ops.bench` (`make bench`): toolloop measured against plain Celery on the same Redis and workers.

Modules: `tools` (what the workers serve: no-op and parking tools, and a plain Celery no-op task),
`instant` (a zero-latency in-process model and the orchestrator process that uses it), `procs` (starting
and measuring processes), `scenarios` (the measurements), `storage` (what a turn costs in Redis bytes written,
Redis memory held and orchestrator CPU as its conversation grows), `report` (JSON lines and the table).
"""
