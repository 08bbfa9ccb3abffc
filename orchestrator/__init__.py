"""toolloop's orchestrator: owns each turn's loop; never imports tool code."""
