"""The orchestrator process: drives many turns at once in one asyncio event loop.

The state machine decides; the runtime only performs what it decides and feeds back what happened. This
module is the process around the turns: it claims and takes over turns and hands them to the driver, reads
the one inbox stream for all of them, renews their leases, and starts and stops everything:

    claim / take over ──► TurnDriver.adopt ──► machine.start / resume ──► save, perform, step …
    inbox stream ──► _handle_inbox ──► TurnDriver.deliver / defer ──► machine.step ──► save, perform …
    lease renewal ──► a lost lease drops its turn            timer heap ──► TurnDriver ──► TimerFired

Outcomes never come through `AsyncResult.get`: a small one comes in its notification, a large one is read
from its key, and every pending call's is read once more whenever a turn is claimed or taken over.
Stopping (SIGTERM, SIGINT, `request_stop`) cancels all it waits on, whatever Redis does; what it owes Redis
(releasing leases, unregistering) gets `STOP_REDIS_S` at most: a lease left behind expires, taken over.
No Redis failure ends the process: unreachable, out of memory or read-only, every loop retries with capped
backoff (`orchestrator.outage`), a step its save until it lands; `RedisOutage` tells the operator once per
`OUTAGE_REPORT_S` and at its end, `toolloop_redis_errors_total` counts each retry by loop and class.
No record ends a loop either: one this release cannot read (another release wrote it, `workers.records`)
is told, left out or its turn set aside (`runtime.adopt.SetAside`), and the loop goes on with the next.

Design notes: docs/design/orchestrators.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from celery import Celery

from orchestrator.archive import ArchivingTurnStore, TurnArchiver
from orchestrator.attention import AttentionSender
from orchestrator.machine.events import Event, ToolFinished
from orchestrator.outage import OUTAGE_REPORT_S, REDIS_ERRORS, Backoff, RedisOutage, RedisRetry
from orchestrator.pricing import build_api_urls, build_price_table
from orchestrator.providers.registry import ModelClients
from orchestrator.providers.transport import build_model_http
from orchestrator.publishing.publisher import Publisher, get_producer_app
from orchestrator.runtime.durability import DurabilityWatcher, build_watch_interval
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.inbox import InboxBatch, parse_inbox, parse_payloads, to_local_outcome
from orchestrator.runtime.perform import Performer
from orchestrator.runtime.traced import TracingTurnDriver
from orchestrator.runtime.turn_spans import TurnSpans
from orchestrator.settings import Settings
from orchestrator.store.codec import ClaimedTurn
from orchestrator.store.rate_limits import ModelLimiter
from orchestrator.store.turns import TurnStore
from orchestrator.tenant_limits import build_running_caps
from workers.contract import ToolOutcome
from workers.keys import build_inbox_ttl_s
from workers.tracing import setup_tracing, shutdown_tracing

log = logging.getLogger("toolloop.orchestrator")

__all__ = [
    "OUTAGE_REPORT_S",
    "STOP_REDIS_S",
    "RedisOutage",
    "Runtime",
    "RuntimeOptions",
    "build_orchestrator_id",
    "serve",
]

BLOCK_S = 1.0  # how long one blocking Redis read waits (a stop request cancels it at once)
# How long one claim waits for a turn (blocking on ready tokens, looking again every READY_POLL_MS): every
# new wait begins with a claim script, so a short one would cost an idle orchestrator Redis's work for naught.
CLAIM_WAIT_S = 30.0
INBOX_ACK_S = 1.0  # how often the inbox stream is trimmed up to what was handled
# How long a stopping orchestrator waits for Redis at most (releasing leases, unregistering): past it a lease
# is left to expire, and its turn is taken over as after a crash.
STOP_REDIS_S = 3.0
CANCEL_AGAIN_S = 0.5  # how often a stopping process cancels again a loop that has not ended
# How often parked turns due are woken (queued for any orchestrator), and how early: a wait's timer then fires
# on time in the orchestrator that claims the turn (the driver never parks a turn due within PARK_AHEAD_S).
WAKE_SCAN_S = 1.0
WAKE_AHEAD_S = 1.0
WAKE_BATCH = 100


def build_orchestrator_id() -> str:
    """A unique, readable id: host, pid and a random suffix (a restarted process never reuses one)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class RuntimeOptions:
    """Tuning of one orchestrator process; the defaults come from `Settings`."""

    lease_ttl_s: float = 15.0
    max_turns: int = 10_000
    orphan_scan_s: float = 5.0
    lost_call_grace_s: float = 5.0
    lost_call_wait_s: float = 60.0
    # How many idle turns keep their parsed state; the others are parked as their JSON (see TurnHandle).
    hydrated_turns: int = 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> RuntimeOptions:
        """Options as configured through `TOOLLOOP_*` variables."""
        return cls(
            lease_ttl_s=settings.lease_ttl_s,
            max_turns=settings.orchestrator_max_turns,
            # Scanning a few times per lease period bounds how long an orphan waits.
            orphan_scan_s=max(0.5, settings.lease_ttl_s / 3),
            lost_call_grace_s=settings.lost_call_grace_s,
            lost_call_wait_s=settings.lost_call_wait_s,
        )


class Runtime:
    """One orchestrator: `await run()` until `request_stop()` (or SIGTERM/SIGINT with `install_signals`)."""

    def __init__(
        self,
        *,
        store: TurnStore,
        celery_app: Celery,
        http: httpx.AsyncClient,
        settings: Settings,
        options: RuntimeOptions | None = None,
        orchestrator_id: str | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.options = options or RuntimeOptions.from_settings(settings)
        self.orchestrator_id = orchestrator_id or build_orchestrator_id()
        self.outage = RedisOutage(settings.redis_url)
        # One retry policy for every loop and turn: a stop request ends their pauses at once.
        self.retry = RedisRetry(self.outage)
        self._stopping = self.retry.stopping
        # Each turn's span (tracing on): the model calls' parent, and the context its tool tasks carry.
        self.spans = TurnSpans(store.redis, ttl_s=store.retention.turn_ttl_s)
        # With no broker set, the state Redis is the broker: the store's client writes the tool calls.
        broker = store.redis if settings.broker_url is None else None
        publisher = Publisher(celery_app, self.retry, trace_of=self.spans.carrier, broker=broker)
        self.performer = Performer(
            store=store,
            publisher=publisher,
            # No retries inside a client: the state machine counts model retries.
            models=ModelClients(settings, http, max_retries=0),
            retry=self.retry,
            stream_flush_s=settings.stream_flush_s,
            prompt_caching=settings.prompt_caching,
            # The price list with the deployment's prices and aliases; a base URL the list knows (Groq's,
            # Google's OpenAI-compatible one) prices its models as that vendor's.
            prices=build_price_table(
                settings.model_prices, aliases=settings.model_aliases, api_urls=build_api_urls(settings)
            ),
            context_windows=settings.context_windows,
            start_models=[settings.model, *settings.model_tiers.values()],
            spans=self.spans,
            tool_gone_after_s=settings.tool_gone_after_s,
            limiter=ModelLimiter(store.redis, settings.model_limits, settings.tenant_limits),
        )
        # What the claim holds each tenant's running turns to (TOOLLOOP_TENANT_LIMITS' max_running_turns).
        self.running_caps = build_running_caps(settings.tenant_limits)
        # With an archive task configured, each turn's outcome, once stored, is sent on to it.
        self.archiver: TurnArchiver | None = None
        if settings.archive_task:
            self.archiver = TurnArchiver(
                store, publisher, self.retry, task=settings.archive_task, queue=settings.archive_queue
            )
        # With an attention task configured, each call that starts waiting for a person is told to it.
        attention = None
        if settings.attention_task:
            attention = AttentionSender(
                publisher, task=settings.attention_task, queue=settings.attention_queue
            )
        self.attention = attention
        self.driver = TracingTurnDriver(
            store=store if self.archiver is None else ArchivingTurnStore(store, self.archiver),
            performer=self.performer,
            settings=settings,
            orchestrator_id=self.orchestrator_id,
            hydrated_turns=self.options.hydrated_turns,
            lost_call_grace_s=self.options.lost_call_grace_s,
            lost_call_wait_s=self.options.lost_call_wait_s,
            retry=self.retry,
            attention=attention,
        )
        self.turns = self.driver.turns
        self.durability = DurabilityWatcher(
            store=store,
            driver=self.driver,
            orchestrator_id=self.orchestrator_id,
            redis_url=self.outage.url,
            interval_s=build_watch_interval(self.options.lease_ttl_s),
        )

    # --- lifecycle -------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming, persist and release every turn, and return from `run()`."""
        self._stopping.set()

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop the process gracefully (call from inside the running loop)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    async def run(self) -> None:
        """Serve until stopped: register, then claim, take over, read the inbox, renew leases, fire timers."""
        # Everything serving waits on (registering while Redis is away included) runs in one task that a
        # stop request cancels: no wait of its own can keep the process from stopping.
        serving = asyncio.create_task(self._serve(), name="serve")
        stop = asyncio.create_task(self._stopping.wait(), name="stop")
        try:
            done, _ = await asyncio.wait([stop, serving], return_when=asyncio.FIRST_COMPLETED)
            if serving in done:
                serving.result()  # a loop that ended on its own is a bug: surface it
        finally:
            # However `run` ends (its task cancelled included), the turns' retries give up from here on.
            self._stopping.set()
            for task in (serving, stop):
                task.cancel()
            await asyncio.gather(serving, stop, return_exceptions=True)
            await self._shutdown()

    async def _serve(self) -> None:
        await self._register()
        log.info("orchestrator %s started", self.orchestrator_id)
        loops = [
            asyncio.create_task(self._claim_loop(), name="claim"),
            asyncio.create_task(self._inbox_loop(), name="inbox"),
            asyncio.create_task(self._lease_loop(), name="leases"),
            asyncio.create_task(self._orphan_loop(), name="orphans"),
            asyncio.create_task(self._wake_loop(), name="wake"),
            asyncio.create_task(self.driver.timers.run(), name="timers"),
            asyncio.create_task(self.durability.run(), name="durability"),
        ]
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            await cancel_until_done(loops)

    async def _register(self) -> None:
        await self.retry.call("register", lambda: self.store.register_orchestrator(self.orchestrator_id))
        # Before any turn is claimed: a notification to this orchestrator finds its inbox with an expiry.
        await self.retry.call("inbox", self._keep_inbox)

    async def _keep_inbox(self) -> None:
        await self.store.keep_inbox(self.orchestrator_id, build_inbox_ttl_s(self.options.lease_ttl_s))

    async def _shutdown(self) -> None:
        # Every step persists its state before acting, so stopping is: wait for steps in progress, drop the
        # in-flight work (the next owner redoes or re-reads it), release the leases. A Redis that does not
        # answer gets STOP_REDIS_S in all: what is left undone then is what a crash leaves. Whatever Redis
        # does meanwhile (unreachable, out of memory, read-only), this never raises.
        deadline = asyncio.get_running_loop().time() + STOP_REDIS_S
        try:
            async with asyncio.timeout_at(deadline):
                await self.driver.drop_all()
        except REDIS_ERRORS as exc:  # TimeoutError included
            log.warning(
                "Redis at %s did not do what stopping asks within %.0f s (%s): the leases not released "
                "expire and their turns are taken over",
                self.outage.url,
                STOP_REDIS_S,
                str(exc) or "timed out",
            )
        if self.archiver is not None:
            # Records of turns that just finished go out before the publishing thread ends.
            await self.archiver.aclose(deadline - asyncio.get_running_loop().time())
        if self.attention is not None:
            await self.attention.aclose(deadline - asyncio.get_running_loop().time())
        self.spans.end_all(how="released")  # those a stop did not reach in time
        await self.performer.aclose()
        with contextlib.suppress(*REDIS_ERRORS):
            async with asyncio.timeout_at(deadline):
                await self.store.unregister(self.orchestrator_id)
        log.info("orchestrator %s stopped", self.orchestrator_id)

    # --- the loops -------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        backoff = Backoff(self.retry, "claim")
        while not self._stopping.is_set():
            if len(self.turns) >= self.options.max_turns:
                await asyncio.sleep(BLOCK_S)
                continue
            try:
                claimed = await self.store.claim_turn(
                    self.orchestrator_id,
                    timeout_s=CLAIM_WAIT_S,
                    lease_ttl_s=self.options.lease_ttl_s,
                    caps=self.running_caps,
                )
            except REDIS_ERRORS as exc:
                await self.retry.pause(backoff.failed(exc))
                continue
            except Exception:
                # Not Redis, and not one turn's records (adopting sets those aside): told, paused, and on.
                log.exception("claiming a turn failed; claiming goes on")
                await self.retry.pause(BLOCK_S)
                continue
            backoff.succeeded()
            if claimed is not None:
                await self._adopt(claimed.turn_id, how="claimed", claimed=claimed)

    async def _adopt(self, turn_id: str, *, how: str, claimed: ClaimedTurn | None = None) -> None:
        # `TurnDriver.adopt` sets a turn it cannot run aside; anything else it raises is one turn's failure,
        # never the loop's: the turn is set aside too, its lease left to expire.
        try:
            await self.driver.adopt(turn_id, how=how, claimed=claimed)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("turn %s: adopting it failed; left to another orchestrator", turn_id)
            self.driver.set_aside.add(turn_id)

    async def _orphan_loop(self) -> None:
        backoff = Backoff(self.retry, "orphans")
        while True:
            # The scan period is the pause after a failure too: orphans are only ever waited for.
            await asyncio.sleep(self.options.orphan_scan_s)
            try:
                orphans = await self.store.find_orphans()
                for turn_id in orphans:
                    if self._stopping.is_set() or len(self.turns) >= self.options.max_turns:
                        break
                    # A turn set aside here is left to the orchestrators that can run it.
                    if turn_id in self.turns or turn_id in self.driver.set_aside:
                        continue
                    if await self.store.take_over(self.orchestrator_id, turn_id, self.options.lease_ttl_s):
                        await self._adopt(turn_id, how="taken_over")
            except REDIS_ERRORS as exc:
                backoff.failed(exc)
            else:
                backoff.succeeded()

    async def _wake_loop(self) -> None:
        # Parked turns hold no lease and are in no orchestrator: an answer queues its turn at once
        # (control.lua); a wait that ends unanswered is queued here, by whichever orchestrator looks first.
        backoff = Backoff(self.retry, "wake")
        while True:
            await asyncio.sleep(WAKE_SCAN_S)
            try:
                woken = await self.store.wake_parked(time.time() + WAKE_AHEAD_S, WAKE_BATCH)
            except REDIS_ERRORS as exc:
                backoff.failed(exc)
                continue
            backoff.succeeded()
            if woken:
                log.info("woke %d parked turn(s) whose wait ends: %s", len(woken), ", ".join(woken[:5]))

    async def _lease_loop(self) -> None:
        # A failed renewal is tried again after a short backoff, a successful one a period later: a Redis that
        # restarts again and again must not be down at every renewal of a lease's lifetime.
        renewing, beating = Backoff(self.retry, "leases"), Backoff(self.retry, "heartbeat")
        period = pause = self.options.lease_ttl_s / 3
        while True:
            await asyncio.sleep(pause)
            # Leases first, whatever the heartbeat does: renewing adds no memory (PEXPIRE), so a Redis out of
            # memory that refuses the heartbeat still leaves this process its turns.
            try:
                lost = await self.store.renew_leases(
                    self.orchestrator_id, list(self.turns), self.options.lease_ttl_s
                )
                await self._keep_inbox()  # PEXPIRE too: it outlives this process by a few lease periods
                pause = period
            except REDIS_ERRORS as exc:
                lost, pause = set(), min(renewing.failed(exc), period)
            else:
                renewing.succeeded()
            try:
                await self.store.heartbeat(self.orchestrator_id)
            except REDIS_ERRORS as exc:
                beating.failed(exc)
            else:
                beating.succeeded()
            if lost:
                # A lease gone with the whole of Redis's data is a loss, told and recorded as such (not as a
                # lease taken by a peer): the watcher looks first.
                lost -= await self._check_durability()
            for turn_id in lost:
                handle = self.turns.get(turn_id)
                if handle is not None:
                    log.warning("lease of %s lost: dropping the turn", turn_id)
                    self.driver.lose(handle)

    async def _check_durability(self) -> set[str]:
        try:
            return await self.durability.check()
        except REDIS_ERRORS:
            return set()  # the watcher's own loop says why, and looks again
        except Exception:
            log.exception("checking Redis's durability failed; the leases are handled as lost")
            return set()

    async def _inbox_loop(self) -> None:
        backoff = Backoff(self.retry, "inbox")
        after = "0"
        acked = "0"
        acked_at = time.monotonic()
        while True:
            try:
                entries = await self.store.read_inbox(
                    self.orchestrator_id, after, block_ms=int(BLOCK_S * 1000)
                )
                if entries:
                    # `after` moves past entries only once they are handled: a batch whose outcomes could
                    # not be read is read again (nothing of it was delivered). One that fails otherwise is
                    # told and passed: the outcome keys are the record, read again on take-over.
                    try:
                        await self._handle_inbox(entries)
                    except REDIS_ERRORS:
                        raise
                    except Exception:
                        log.exception("inbox entries %s..%s left unhandled", entries[0][0], entries[-1][0])
                    after = entries[-1][0]
                # Trimming only bounds the stream's memory (entries are read by id, never twice): once per
                # INBOX_ACK_S, or when idle, instead of a round trip between every two reads.
                if after != acked and (not entries or time.monotonic() - acked_at >= INBOX_ACK_S):
                    await self.store.ack_inbox(self.orchestrator_id, after)
                    acked, acked_at = after, time.monotonic()
            except REDIS_ERRORS as exc:
                await self.retry.pause(backoff.failed(exc))
                continue
            backoff.succeeded()

    async def _handle_inbox(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        batch = parse_inbox(entries)
        outcomes = parse_payloads(batch.payloads)
        missing = {
            c: t for t, calls in batch.outcomes.items() if t in self.turns for c in calls if c not in outcomes
        }
        if missing:
            outcomes.update(await self.store.read_outcomes(missing))
        now = time.time()
        for turn_id in batch.turns:
            handle = self.turns.get(turn_id)
            if handle is None:
                continue  # not ours (any more): its new owner re-reads outcomes on take-over
            try:
                self._deliver(handle, batch, outcomes, now)
            except Exception:
                # One turn's notifications, never the others' nor the loop: its timers still answer it.
                log.exception("turn %s: inbox notifications left unhandled", turn_id)

    def _deliver(
        self, handle: TurnHandle, batch: InboxBatch, outcomes: Mapping[str, ToolOutcome], now: float
    ) -> None:
        turn_id = handle.turn_id
        started: list[Event] = list(batch.started.get(turn_id, []))
        finished: list[Event] = [
            ToolFinished(outcome=to_local_outcome(outcomes[c]), at=now)
            for c in batch.outcomes.get(turn_id, [])
            if c in outcomes
        ]
        # Outcomes that leave a call of the round unanswered move nothing on: they are held back, like a
        # `started` notification, to be stepped and saved with the round's last (one save, not five).
        if turn_id in batch.control or (finished and not handle.still_waits(finished)):
            self.driver.deliver(handle, started + finished, read_control=turn_id in batch.control)
        elif started or finished:
            self.driver.defer(handle, started + finished)


async def cancel_until_done(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and return once every one has ended: a cancellation swallowed below our code (seen
    under Redis out of memory: the durability watcher's, left looping, `run()` waiting for it forever) is
    sent again every CANCEL_AGAIN_S."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)


async def serve(settings: Settings, *, orchestrator_id: str | None = None) -> None:
    """Run one orchestrator process until SIGTERM/SIGINT: the body of `toolloop orchestrator`.

    Spans go out over OTLP when the OTEL_* variables ask for it (`workers.tracing`), flushed as it stops."""
    setup_tracing("toolloop-orchestrator", record_content=settings.trace_content)
    store = TurnStore.from_url(
        settings.redis_url,
        ssl_cert_reqs=settings.redis_ssl_cert_reqs,
        lease_ttl_s=settings.lease_ttl_s,
        retention=settings.retention,
    )
    celery_app = get_producer_app(settings)
    async with build_model_http(settings.model_max_connections) as http:
        runtime = Runtime(
            store=store, celery_app=celery_app, http=http, settings=settings, orchestrator_id=orchestrator_id
        )
        runtime.install_signals()
        try:
            await runtime.run()
        finally:
            await store.aclose()
            await asyncio.to_thread(shutdown_tracing)
