"""Publishing tool-call tasks onto the broker: used by the runtime for a round's calls and by the clients
for a direct call, so neither imports the other.

    messages   a Celery task message built as Celery builds it (signals, `task-sent` event)
    wire       the store-client path: the commands kombu would send, run as one script call
    publisher  `Publisher`: either path, retried through a Redis outage
"""
