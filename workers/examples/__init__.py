"""Real example tools used by the demo and the docs."""
