"""One module per wire format: pure to_wire / from_wire functions and an httpx adapter."""
