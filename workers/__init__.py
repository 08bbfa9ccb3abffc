"""toolloop's tool runtime: a leaf package that imports nothing from `orchestrator`."""
