"""The context budget of the request-time view, as pure functions the state machine uses.

    windows   known context windows by model-name prefix, the named overrides, the answer's reserve
    tokens    the token estimate of a message, a tool schema and a whole request
    trim      fitting a view into a budget: elide old tool results, drop old exchanges, keep the rest whole

No I/O: the machine calls these while it builds each model call's view.

Design notes: docs/design/model-calls.md, "The context budget".
"""
