"""The orchestrator process: performs what the state machine decides, for many turns in one event loop.

One module per thing owned, each calling only downwards (nothing calls back up into the process):

    process   Runtime: claim, take-over (orphan) and lease loops, the inbox loop, lifecycle, signals, `serve`
    driver    TurnDriver: each turn's handle, lock and steps — adopt (machine.start / resume), step
              (machine.step), persist, park, drop; timers and Finish; the one place the machine is run
    adopt     what adopting reads and filters: the model of a new turn, outcomes missed while unowned
    handle    TurnHandle: one turn's state (parsed, or parked as its saved JSON), lock and tasks
    perform   Performer: an I/O command in, the events it produces out (at once, or from slow work)
    durability DurabilityWatcher: Redis's run id watched; turns lost with its data told, counted, recorded
    publish   Publisher (batched and retried publishes, batched revokes, one thread), send options, limits
    task_wire TaskWire: a batch's messages as the Redis commands kombu would run, for the store's client
    task_messages TaskSender: Celery-protocol task messages and their task-sent events, in one kombu batch
    inbox     inbox entries → machine events, and call ids on the wire (pure)
    timers    the one timer heap of all turns
    turn_spans TurnSpans: each turn's `invoke_agent` span (tracing on), its context for model calls and tasks
    traced    TracingTurnDriver: the driver, opening a turn's span when adopted, closing it when dropped

From an inbox entry to the machine:

    process.Runtime._inbox_loop            one blocking read of the inbox stream for all turns
    → process.Runtime._handle_inbox        entries → events per turn (inbox.parse_inbox, parse_payloads)
    → driver.TurnDriver.deliver            (`started` alone: .defer, then ._flush_deferred → .deliver)
    → driver.TurnDriver._spawn → ._guarded a task of the turn (one: what arrives while it waits joins it)
    → driver.TurnDriver._feed_deferred     under the turn's lock
    → driver.TurnDriver._advance           every event at hand, then one save (._persist)
    → machine.step

After the save, `_advance` performs the commands (`driver.TurnDriver._perform` → `perform.Performer.perform`):
events produced at once go round `_advance`'s loop into `machine.step` again; slow work (a model call, a
dispatch) is a coroutine run by `_spawn` → `_guarded`, whose events enter at `_feed`. Timers come in the same
way: `timers.TimerHeap.run` → `driver.TurnDriver._on_timer` → `.deliver`.
"""
