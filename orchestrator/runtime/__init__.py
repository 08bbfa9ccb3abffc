"""The orchestrator process: performs what the state machine decides, for many turns in one event loop."""
