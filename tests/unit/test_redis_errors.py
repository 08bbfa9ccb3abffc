"""`workers.redis_errors` (issue 35, item 1): what each Redis error means, built as redis-py builds it from
Redis's reply; the one backoff; and that nothing else in orchestrator/ or workers/ judges Redis errors by a
list of its own."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import hiredis
import kombu.exceptions
import pytest
import redis.exceptions as rx
from redis._parsers.base import BaseParser
from redis._parsers.hiredis import _HiredisParser

from workers.redis_errors import (
    BACKOFF_CAP_S,
    BACKOFF_FIRST_S,
    REDIS_ERRORS,
    Backoff,
    RedisErrorKind,
    build_backoff_s,
    classify,
    is_bug,
    is_transient,
    maybe_ran,
)

pytestmark = pytest.mark.timeout(10)

ROOT = Path(__file__).resolve().parents[2]
K = RedisErrorKind


def parse_reply(line: str) -> Exception:
    """The exception redis-py makes of Redis's error reply `-<line>\\r\\n`: hiredis reads the bytes and hands
    the text to redis-py's `parse_error`, as every toolloop connection does (`test_redis_parser`)."""
    reader = hiredis.Reader(replyError=_HiredisParser.parse_error, encoding="utf-8")
    reader.feed(f"-{line}\r\n".encode())
    error = reader.gets()
    assert isinstance(error, Exception)
    # redis-py's pure-Python parser makes the same exception of the same text.
    same = BaseParser.parse_error(line)
    assert type(same) is type(error) and str(same) == str(error)
    return error


# Each reply as Redis sends it, and what it means. Script texts are Redis 7's (the code first) and Redis 6's
# (the script's error, the refused command's code after a dash).
REPLIES: list[tuple[str, RedisErrorKind, str | None, type[Exception]]] = [
    ("READONLY You can't write against a read only replica.", K.FAILOVER, "READONLY", rx.ReadOnlyError),
    (
        "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
        K.FAILOVER,
        "UNBLOCKED",
        rx.ResponseError,
    ),
    (
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        K.FAILOVER,
        "MASTERDOWN",
        rx.MasterDownError,
    ),
    ("NOREPLICAS Not enough good replicas to write.", K.FAILOVER, "NOREPLICAS", rx.ResponseError),
    (
        "OOM command not allowed when used memory > 'maxmemory'.",
        K.OUT_OF_MEMORY,
        "OOM",
        rx.OutOfMemoryError,
    ),
    (
        "OOM command not allowed when used memory > 'maxmemory'. script: "
        "e0e1f9fabfc9d4800c877a703b823ac0578ff8db, on @user_script:1.",
        K.OUT_OF_MEMORY,
        "OOM",
        rx.OutOfMemoryError,
    ),
    (
        "ERR Error running script (call to f_4de8ee855b77bb03f67fb740939aa8a297b12ed6): @user_script:18: "
        "@user_script: 18: -OOM command not allowed when used memory > 'maxmemory'.",
        K.OUT_OF_MEMORY,
        "OOM",
        rx.ResponseError,
    ),
    ("LOADING Redis is loading the dataset in memory", K.LOADING, "LOADING", rx.BusyLoadingError),
    (
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        K.LOADING,
        "BUSY",
        rx.ResponseError,
    ),
    ("MOVED 3999 127.0.0.1:6381", K.CLUSTER_MOVING, "MOVED", rx.MovedError),
    ("ASK 3999 127.0.0.1:6381", K.CLUSTER_MOVING, "ASK", rx.AskError),
    (
        "TRYAGAIN Multiple keys request during rehashing of slot",
        K.CLUSTER_MOVING,
        "TRYAGAIN",
        rx.TryAgainError,
    ),
    ("CLUSTERDOWN The cluster is down", K.CLUSTER_MOVING, "CLUSTERDOWN", rx.ClusterDownError),
    (
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
        K.CANNOT_PERSIST,
        "MISCONF",
        rx.ResponseError,
    ),
    (
        "WRONGPASS invalid username-password pair or user is disabled.",
        K.ACCESS_DENIED,
        "WRONGPASS",
        rx.AuthenticationError,
    ),
    ("NOAUTH Authentication required.", K.ACCESS_DENIED, "NOAUTH", rx.AuthenticationError),
    (
        "NOPERM User bot has no permissions to run the 'set' command",
        K.ACCESS_DENIED,
        "NOPERM",
        rx.NoPermissionError,
    ),
    ("NOSCRIPT No matching script. Please use EVAL.", K.NO_SCRIPT, "NOSCRIPT", rx.NoScriptError),
    (
        "ERR user_script:1: Script attempted to access nonexistent global variable 'x' script: "
        "e0e1f9fabfc9d4800c877a703b823ac0578ff8db, on @user_script:1.",
        K.SCRIPT_ERROR,
        "ERR",
        rx.ResponseError,
    ),
    (
        "ERR Error compiling script (new function): user_script:1: '=' expected near 'end'",
        K.SCRIPT_ERROR,
        "ERR",
        rx.ResponseError,
    ),
    (
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        K.WRONG_COMMAND,
        "WRONGTYPE",
        rx.ResponseError,
    ),
    ("ERR unknown command 'SETT', with args beginning with: ", K.WRONG_COMMAND, "ERR", rx.ResponseError),
    ("BUSYGROUP Consumer Group name already exists", K.WRONG_COMMAND, "BUSYGROUP", rx.ResponseError),
    (
        "CROSSSLOT Keys in request don't hash to the same slot",
        K.WRONG_COMMAND,
        "CROSSSLOT",
        rx.ClusterCrossSlotError,
    ),
    (
        "EXECABORT Transaction discarded because of previous errors.",
        K.WRONG_COMMAND,
        "EXECABORT",
        rx.ExecAbortError,
    ),
]


@pytest.mark.parametrize(
    ("reply", "kind", "code", "raised_as"), REPLIES, ids=[reply[:24] for reply, *_ in REPLIES]
)
def test_each_reply_means_its_kind(
    reply: str, kind: RedisErrorKind, code: str | None, raised_as: type[Exception]
) -> None:
    error = parse_reply(reply)
    assert type(error) is raised_as
    meaning = classify(error)
    assert meaning is not None
    assert (meaning.kind, meaning.code) == (kind, code)
    assert is_transient(error) == kind.transient
    assert is_bug(error) == (kind in (K.SCRIPT_ERROR, K.WRONG_COMMAND))
    assert not maybe_ran(error)  # Redis answered: the command did not run


def test_a_refusal_redis_py_annotates_in_a_pipeline_keeps_its_kind() -> None:
    # redis-py rewrites a pipeline's error message (the code is gone, the command quoted), keeping the class.
    oom = parse_reply("OOM command not allowed when used memory > 'maxmemory'.")
    oom.args = (f"Command # 1 (SET k OOM) of pipeline caused error: {oom.args[0]}",)
    wrong = parse_reply("WRONGTYPE Operation against a key holding the wrong kind of value")
    wrong.args = (f"Command # 2 (SET MASTERDOWN -OOM) of pipeline caused error: {wrong.args[0]}",)
    assert classify(oom) == classify(parse_reply("OOM x"))
    meaning = classify(wrong)
    assert meaning is not None and meaning.kind is K.WRONG_COMMAND  # the quoted arguments are not codes


@pytest.mark.parametrize(
    "error",
    [
        rx.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
        rx.TimeoutError("Timeout reading from socket"),
        rx.MaxConnectionsError("Too many connections"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_lost_connection_is_unreachable_and_may_have_run(error: Exception) -> None:
    meaning = classify(error)
    assert meaning is not None and meaning.kind is K.UNREACHABLE and meaning.transient
    assert meaning.reconnect and maybe_ran(error)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (rx.SlotNotCoveredError("Slot 5 not covered by the cluster."), K.CLUSTER_MOVING),
        (
            rx.RedisClusterException(
                "Redis Cluster cannot be connected. Please provide at least one reachable node: refused"
            ),
            K.UNREACHABLE,
        ),
        (
            rx.RedisClusterException("All slots are not covered after query all startup_nodes. 5 of 16384"),
            K.CLUSTER_MOVING,
        ),
        (rx.RedisClusterException("No way to dispatch this command to Redis Cluster. Missing key."), None),
        (
            rx.RedisClusterException(
                "Redis Cluster cannot be connected. Please provide at least one reachable node: Cluster mode "
                "is not enabled on this node"
            ),
            None,
        ),
    ],
    ids=["slot-not-covered", "no-node", "slots-missing", "no-key", "no-cluster"],
)
def test_what_the_cluster_client_raises_of_its_own_has_its_kind(
    error: Exception, kind: RedisErrorKind | None
) -> None:
    # Not `RedisError`s: caught all the same (REDIS_ERRORS), and a wrong call stays a bug.
    assert isinstance(error, REDIS_ERRORS)
    meaning = classify(error)
    assert meaning is not None
    if kind is None:
        assert meaning.kind is K.WRONG_COMMAND and meaning.bug
    else:
        assert meaning.kind is kind and meaning.transient


def test_only_a_lost_connection_or_a_demoted_master_asks_for_a_new_connection() -> None:
    reconnect = {
        reply for reply, *_ in REPLIES if (meaning := classify(parse_reply(reply))) and meaning.reconnect
    }
    assert reconnect == {
        "READONLY You can't write against a read only replica.",
        "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
    }


def test_an_error_kombu_wrapped_is_found_behind_its_wrapper() -> None:
    oom = parse_reply("OOM command not allowed when used memory > 'maxmemory'.")
    try:
        try:
            raise oom
        except rx.RedisError as exc:
            raise kombu.exceptions.OperationalError(str(exc)) from exc
    except kombu.exceptions.OperationalError as wrapped:
        meaning = classify(wrapped)
    assert meaning is not None and meaning.kind is K.OUT_OF_MEMORY
    assert classify(ValueError("not Redis")) is None
    assert not is_transient(ValueError("not Redis")) and not is_bug(ValueError("not Redis"))


def test_every_kind_is_transient_or_not_and_only_wrong_calls_are_bugs() -> None:
    transient = {kind for kind in K if kind.transient}
    assert transient == {
        K.UNREACHABLE,
        K.FAILOVER,
        K.OUT_OF_MEMORY,
        K.LOADING,
        K.CLUSTER_MOVING,
        K.CANNOT_PERSIST,
    }
    assert {kind for kind in K if kind.bug} == {K.SCRIPT_ERROR, K.WRONG_COMMAND}
    assert {kind for _, kind, _, _ in REPLIES} | {K.UNREACHABLE} == set(K)  # the table covers every kind


# --- the backoff ------------------------------------------------------------------------------------------


def test_the_backoff_doubles_to_its_cap_with_equal_jitter_from_an_injected_random_source() -> None:
    steps = [min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2 ** (n - 1)) for n in range(1, 12)]
    assert [build_backoff_s(n, rand=lambda: 0.0) for n in range(1, 12)] == steps
    draws = random.Random(35)
    for n, step in enumerate(steps, 1):
        for _ in range(200):
            assert step / 2 < build_backoff_s(n, rand=draws.random) <= step
    assert build_backoff_s(3, rand=lambda: 0.5) == pytest.approx(0.4 * 0.75)
    # Bounds of its own: a pool child's backoff, say.
    assert build_backoff_s(1, first_s=0.05, cap_s=1.0, rand=lambda: 0.0) == 0.05
    assert build_backoff_s(9, first_s=0.05, cap_s=1.0, rand=lambda: 0.0) == 1.0


def test_the_backoff_spreads_its_pauses() -> None:
    draws = random.Random(7)
    pauses = {round(build_backoff_s(6, rand=draws.random), 3) for _ in range(100)}
    assert len(pauses) > 50 and min(pauses) < 1.2 and max(pauses) > 1.8


def test_an_outage_of_hours_does_not_overflow_the_backoff() -> None:
    # 2.0 ** 1024 raises OverflowError: a loop failing every 2 s meets it after about half an hour.
    assert build_backoff_s(100_000, rand=lambda: 0.0) == BACKOFF_CAP_S


def test_a_loop_backoff_counts_its_failures_and_starts_again_after_a_success() -> None:
    backoff = Backoff(first_s=0.05, cap_s=0.2, rand=lambda: 0.0)
    assert [backoff.next_s() for _ in range(4)] == [0.05, 0.1, 0.2, 0.2]
    backoff.reset()
    assert backoff.next_s() == 0.05


# --- nobody else judges Redis errors ---------------------------------------------------------------------

ONE_MODULE = Path("workers/redis_errors.py")
# Where an except clause (or an isinstance, a suppress, a tuple of errors) names one Redis error class or an
# error code of its own: none. Catching the whole family (`redis.RedisError`, `REDIS_ERRORS`) is the way.
ALLOWED: set[tuple[str, str]] = set()
FAMILY = {"RedisError"}
REDIS_ERROR_CLASSES = {
    name
    for name, value in vars(rx).items()
    if isinstance(value, type) and issubclass(value, BaseException) and name not in FAMILY
}
CODES = {
    "OOM",
    "READONLY",
    "LOADING",
    "BUSY",
    "MISCONF",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "WRONGTYPE",
    "NOSCRIPT",
    "EXECABORT",
    "CROSSSLOT",
    "WRONGPASS",
    "NOAUTH",
    "NOPERM",
}
CODE_TEXTS = ("maxmemory'", "read only replica", "You can't write")


def _redis_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    # The local names of redis' exception classes, and of the modules they can be reached through.
    classes: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "redis":
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            for alias in node.names:
                if alias.name in REDIS_ERROR_CLASSES:
                    classes.add(alias.asname or alias.name)
                elif alias.name == "exceptions":
                    modules.add(alias.asname or alias.name)
    return classes, modules


def _names_a_redis_class(node: ast.AST, classes: set[str], modules: set[str]) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in classes:
            return sub.id
        if isinstance(sub, ast.Attribute) and sub.attr in REDIS_ERROR_CLASSES:
            root = sub.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                return ast.unparse(sub)
    return None


def _names_a_code(node: ast.AST) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            words = set(sub.value.replace("-", " ").split())
            if words & CODES or any(text in sub.value for text in CODE_TEXTS):
                return sub.value
    return None


def find_own_judgements(path: Path) -> list[str]:
    """Where `path` judges a Redis error itself: the error classes or codes in its except clauses, its
    isinstance checks, its `suppress(...)` and its tuples of exception classes."""
    tree = ast.parse(path.read_text(), str(path))
    classes, modules = _redis_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        judged: list[ast.AST] = []
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            judged.append(node.type)
        elif isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            if callee in ("isinstance", "issubclass") and len(node.args) == 2:
                judged.append(node.args[1])
            elif callee.endswith("suppress"):
                judged.extend(node.args)
        elif isinstance(node, (ast.Tuple, ast.Compare)):  # `(ReadOnlyError, …)`, `"OOM" in text`
            judged.append(node)
        for part in judged:
            named = _names_a_class_or_code(part, classes, modules)
            if named is not None:
                found.append(f"{path}:{getattr(part, 'lineno', '?')}: {named}")
    return found


def _names_a_class_or_code(part: ast.AST, classes: set[str], modules: set[str]) -> str | None:
    return _names_a_redis_class(part, classes, modules) or _names_a_code(part)


def test_no_module_but_one_judges_redis_errors_by_a_list_of_its_own() -> None:
    files = sorted(
        path.relative_to(ROOT)
        for package in ("orchestrator", "workers")
        for path in (ROOT / package).rglob("*.py")
    )
    assert ONE_MODULE in files
    found = [
        line
        for path in files
        if path != ONE_MODULE
        for line in find_own_judgements(ROOT / path)
        if (str(path), line.split(": ", 1)[1]) not in ALLOWED
    ]
    assert found == [], "judge Redis errors with workers.redis_errors.classify:\n" + "\n".join(found)


def test_the_scan_sees_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import redis\n"
        "from redis.exceptions import ReadOnlyError as RO\n"
        "from redis import exceptions as rx\n"
        "def f(exc):\n"
        "    try:\n"
        "        pass\n"
        "    except (redis.exceptions.ConnectionError, OSError):\n"
        "        pass\n"
        "    except redis.RedisError:\n"  # the whole family: fine
        "        pass\n"
        "    if isinstance(exc, RO) or 'OOM command not allowed' in str(exc):\n"
        "        pass\n"
        "    WAITED = (rx.TimeoutError, OSError)\n"
        "    return exc.code == 'READONLY'\n"
    )
    found = [line.split(": ", 1)[1] for line in find_own_judgements(sample)]
    assert sorted(found) == sorted(
        [
            "redis.exceptions.ConnectionError",  # the except clause
            "redis.exceptions.ConnectionError",  # and the tuple in it
            "RO",
            "OOM command not allowed",
            "rx.TimeoutError",
            "READONLY",
        ]
    )
