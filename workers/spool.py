"""The outcome spool: a finished call's outcome that Redis refused is kept on disk and written again.

A pool process rides out a Redis outage while it writes an outcome (`workers.redis_retry`), but only until
shortly before its hard limit, when its parent may kill it. An outcome still unwritten then — Redis out of
memory for minutes, say — goes to the spool: one JSON file per write (`OutcomeWrite`, the outcome with its
full result, idempotency record and the guards it drops), written atomically (temporary file, fsync,
rename) into the worker's spool folder. A thread in the worker's main process (`SpoolDrainer`) writes every
spooled outcome again with capped backoff until Redis takes it — WON, or LOST to an outcome that was already
there, or FENCED because a later execution of the call has started — and deletes the file then. It starts
with the worker, so files a previous worker process left in the same folder are written too.

The same thread is the worker's heartbeat (`keys.worker_seen`): after each pass that left nothing waiting,
at most every `keys.WORKER_BEAT_S`, it records when that pass began. A heartbeat therefore says more than
"alive": every outcome spooled before it is in Redis. The orchestrator's lost-call rule reads it for a call
with no outcome past its hard limit: a worker heard from since then has nothing more to deliver; one not
heard from (cut off from Redis, frozen, or dead) is waited for a while longer (TOOLLOOP_LOST_CALL_WAIT_S).

The worker's parent answers for a pool process that cannot answer itself (hard limit, lost process,
revoke); it looks in the spool first (`Spool.holds`), so that such a synthetic answer never beats a real
result waiting there.

The folder is `TOOLLOOP_SPOOL_DIR`, by default `<temp dir>/toolloop-spool`, with one subfolder per Redis
(host, port and database), so that workers of different Redis instances on one host never cross.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import redis
from pydantic import ValidationError

from workers import keys
from workers.call_store import CallStore, OutcomeWrite
from workers.redis_retry import build_backoff_s, is_unavailable
from workers.scripts import WriteResult

logger = logging.getLogger(__name__)

SPOOL_DIR_VAR = "TOOLLOOP_SPOOL_DIR"
# How often an idle drainer looks for new files (a pool process spools rarely; a scan is one listdir).
SCAN_INTERVAL_S = 0.5
_SUFFIX = ".json"


def build_spool_dir(redis_url: str, root: str | None = None) -> Path:
    """The spool folder of a worker on `redis_url`: under `root` (default `TOOLLOOP_SPOOL_DIR`, else the temp
    dir's `toolloop-spool`), a subfolder named by the Redis address (no password in it)."""
    base = Path(root or os.environ.get(SPOOL_DIR_VAR) or Path(tempfile.gettempdir()) / "toolloop-spool")
    # Each part of a Sentinel URL (`sentinel://h1:26379;sentinel://h2:26379/0`) names the same Redis; the
    # credentials before `@` are dropped so that a password change keeps the folder.
    address = ";".join(
        f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"
        for parts in (urlsplit(part.strip()) for part in redis_url.split(";"))
    )
    return base / hashlib.sha256(address.encode()).hexdigest()[:16]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Spool:
    """The spool folder: put a write, tell whether a call has one waiting, drain them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, write: OutcomeWrite) -> Path:
        """Keep `write` on disk (atomically: a reader sees the whole file or none); returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{_digest(write.call_id)}-{_digest(write.outcome_json)[:12]}{_SUFFIX}"
        path = self.directory / name
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(write.model_dump_json())
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        logger.warning("outcome of %s kept in the spool %s until Redis takes it", write.call_id, path)
        return path

    def holds(self, call_id: str) -> bool:
        """True when an outcome of `call_id` waits in the spool."""
        return any(self.directory.glob(f"{_digest(call_id)}-*{_SUFFIX}"))

    def paths(self) -> list[Path]:
        """The spooled writes, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.glob(f"*{_SUFFIX}") if not p.name.startswith(".")]
        with contextlib.suppress(OSError):
            found.sort(key=lambda p: p.stat().st_mtime)
        return found

    def drain(self, store: CallStore) -> int:
        """Try every spooled write once; returns how many are still waiting (Redis still refuses them)."""
        waiting = 0
        for path in self.paths():
            with _locked(path) as locked:
                if locked and not _write_spooled(store, path):
                    waiting += 1
        return waiting


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """An exclusive lock on a spool file, or False when another process drains it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield path.exists()
    finally:
        os.close(fd)


def _write_spooled(store: CallStore, path: Path) -> bool:
    """Write one spooled outcome; True once the file is done with (written, or unreadable and set aside)."""
    try:
        write = OutcomeWrite.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        logger.exception("unreadable spool file %s: set aside as .bad", path)
        with contextlib.suppress(OSError):
            path.rename(path.with_suffix(".bad"))
        return True
    try:
        result = store.finish(write, check_landed=True)
    except redis.RedisError as exc:
        if not is_unavailable(exc):
            logger.exception("spooled outcome of %s refused by Redis; kept", write.call_id)
        return False
    if result is WriteResult.WON:
        logger.warning("spooled outcome of %s written", write.call_id)
    else:
        logger.warning("spooled outcome of %s dropped: %s", write.call_id, result.name)
    path.unlink(missing_ok=True)
    return True


class SpoolDrainer:
    """A daemon thread of the worker's main process that writes spooled outcomes until stopped."""

    def __init__(
        self,
        spool: Spool,
        store: Callable[[], CallStore],
        *,
        scan_interval_s: float = SCAN_INTERVAL_S,
        worker_id: str | None = None,
        beat_s: float = keys.WORKER_BEAT_S,
    ) -> None:
        """`worker_id` (the worker's Celery hostname): the heartbeat to write; None writes none."""
        self.spool = spool
        self.store = store
        self.scan_interval_s = scan_interval_s
        self.worker_id = worker_id
        self.beat_s = beat_s
        self._beaten_at = float("-inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="toolloop-spool", daemon=True)

    def start(self) -> None:
        """Start draining (files left by an earlier worker process first)."""
        self._thread.start()

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            began = time.time()
            try:
                store = self.store()
                waiting = self.spool.drain(store)
                if not waiting:
                    self._beat(store, began)
            except Exception:  # the thread must outlive any one bad pass: the files are still there
                logger.exception("spool pass failed")
                waiting = 1
            failures = failures + 1 if waiting else 0
            # While Redis refuses: the capped backoff of every Redis retry (`workers.redis_retry`).
            pause = build_backoff_s(failures) if waiting else self.scan_interval_s
            self._stop.wait(pause)

    def _beat(self, store: CallStore, began: float) -> None:
        if self.worker_id is None or time.monotonic() - self._beaten_at < self.beat_s:
            return
        try:
            store.client.set(keys.worker_seen(self.worker_id), repr(began), ex=keys.WORKER_SEEN_TTL_S)
        except redis.RedisError as exc:
            if not is_unavailable(exc):
                raise
            return  # Redis away: the next pass beats once it is back
        self._beaten_at = time.monotonic()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop after the current pass (what is left stays on disk for the next worker)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
