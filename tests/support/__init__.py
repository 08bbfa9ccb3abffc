"""Reusable test support: real processes (Redis, Celery workers) and the tools the tests call."""
