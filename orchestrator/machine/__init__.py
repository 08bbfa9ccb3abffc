"""The loop of one turn as a pure, resumable state machine: `(state, event) -> (state, commands)`.

The face is five names: `start` (a new turn's state and first commands), `step` (apply one event), `resume`
(what a new owner of a persisted state must reissue), `parkable` (whether a turn only waits for people, and
until when) and `Policy` (the stop-policy hook). Inside, one module
per concern, in layers; a module imports only from the layers below it (tests/unit/machine/test_layering.py):

    loop          start / step / resume: routes each event, then settles the turn
    model_calls   each model call: its view, tool choice, model controls, budgets before the call
    answers       a final answer: blank ones retried, typed ones validated and sent back (`invalid_output`)
    model_errors  a failed model call: context shrink, backoff and retries, fallback to the next model
    tool_round    one round of tool calls: validation, limits, dispatch, approvals, lost work, outcomes
    stopping      the one stop path and the terminal shapes
    waits         calls waiting for a person: their limits, the paused running clock, parking
    draft         the typed draft of the state one step builds, and the commands it emits
    validation    pre-dispatch validation of a call, and of a typed answer (leaf)
    view          the request-time view of the history (leaf; vendor traits from `providers.traits`)
    budgets       the token and dollar budgets, the sum of the calls' usage and cost (leaf)
    state         the persisted, versioned state and its typed change sets
    events        what goes in (events) and out (commands)

No I/O, no clock, no randomness: time comes in on events, ids derive from the turn id and counters.

Design notes: docs/design/turns.md.
"""

from orchestrator.machine.loop import Policy, parkable, resume, start, step

__all__ = ["Policy", "parkable", "resume", "start", "step"]
