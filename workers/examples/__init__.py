"""Real example tools used by the demo and the docs; importing this package registers them all."""

from workers.examples import arithmetic, demo, http, slow

__all__ = ["arithmetic", "demo", "http", "slow"]
