"""`toolloop demo`: an embedded Redis, a worker and an orchestrator, one real turn printed as it runs.

run   starts the processes and runs the turn
view  prints the turn's events, transcript and summary
"""
