"""Turns on a schedule: a cron expression or an interval, an overlap policy, and what each run submits.

    schedule  the `Schedule`, its state, and the pure rules: next run, due or not, overlap decision (sans-IO)
    storage   schedules in Redis as operations and flows, and `run_due`, one due tick handled
    calls     what `Client.schedule` / `AsyncClient.schedule` take, and the flows both clients run
    beat      `toolloop beat`: Celery beat on these schedules, one active beat at a time (a Redis lease)

Design and use: docs/guides/schedules.md.
"""
