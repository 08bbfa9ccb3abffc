"""Turns in Redis: the atomic scripts, the pure operations on keys, and the async and sync stores."""
