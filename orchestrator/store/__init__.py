"""Turns in Redis: Lua scripts as files with typed results, pure operations, and the async and sync stores.

lua/*.lua     the atomic steps over turns (KEYS, ARGV and reply in each file's header)
scripts       loads them (with the workers' loader, which also gives the shared write_outcome.lua and
              release.lua) and names each one's result (SubmitResult, SaveResult, ControlResult …)
codec         layout, turn ids, request checks, event fields, reply decoding (pure)
turn_view     what a turn looks like to a reader: TurnView, PendingApproval (pure)
effects       an operation as a value: Command, ScriptCall, Transaction; BlockingCall, Emit; Flow
operations    the table: one pure builder per round trip (words or KEYS/ARGV, and the reply's parser)
flows         the multi-step flows (claim, wait, follow events, control …) as sans-IO generators
runner        SyncRunner / AsyncRunner: perform operations and drive flows on a redis-py client
connection    connect_sync / connect_async, and how long one blocking read may block (block_cap_ms)
turns         TurnStore, async: the runtime's, the API's and AsyncClient's store
sync_turns    SyncTurnStore: Client's store, the same operations and flows performed synchronously
catalogue     the live tool catalogue workers publish
"""
