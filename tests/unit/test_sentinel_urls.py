"""Celery's Sentinel URL form (`sentinel://h1:26379;sentinel://h2:26379/0`) with TOOLLOOP_REDIS_MASTER_NAME:
what each part means, what the broker, the result backend, Flower and the Redis clients are given, and the
configuration errors. Nothing here connects: redis-py and kombu open connections on first use.
"""

from __future__ import annotations

import pytest
from celery.backends.redis import SentinelBackend
from flower.utils.broker import Broker, RedisSentinel
from kombu import Connection

from orchestrator.publishing.publisher import get_producer_app
from orchestrator.settings import Settings
from orchestrator.store.connection import MAX_BLOCK_MS, block_cap_ms, connect_async, connect_sync
from workers.app import BODY_ENCODING, PRIORITY_STEPS, build_celery_config, create_app
from workers.connect import (
    MASTER_NAME_VARIABLE,
    AsyncMasterCheckingPool,
    AsyncSentinelRedis,
    MasterCheckingPool,
    SentinelRedis,
    SentinelTarget,
    build_sentinel_broker_url,
    connect_redis,
    connect_redis_async,
    parse_sentinel_url,
)
from workers.errors import RedisConfigError, ToolloopError
from workers.settings import WorkerSettings, build_broker_url

pytestmark = pytest.mark.timeout(10)

URL = "sentinel://h1:26379;sentinel://h2:26380/0"


@pytest.fixture(autouse=True)
def _no_master_name_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MASTER_NAME_VARIABLE, raising=False)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (URL, SentinelTarget(sentinels=(("h1", 26379), ("h2", 26380)), db=0)),
        ("sentinel://h1", SentinelTarget(sentinels=(("h1", 26379),))),
        (
            "sentinel://:p%40ss@h1:1;sentinel://:p%40ss@h2:2/3?socket_timeout=1.5",
            SentinelTarget(
                sentinels=(("h1", 1), ("h2", 2)), db=3, password="p@ss", options={"socket_timeout": 1.5}
            ),
        ),
        (
            "sentinel://u:pw@h1/2;",
            SentinelTarget(sentinels=(("h1", 26379),), db=2, username="u", password="pw"),
        ),
    ],
)
def test_parse_sentinel_url(url: str, target: SentinelTarget) -> None:
    assert parse_sentinel_url(url) == target


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sentinel://h1/1;sentinel://h2/2", "disagree on db"),
        ("sentinel://:a@h1;sentinel://:b@h2", "disagree on password"),
        ("sentinel://h1;redis://h2/0", "starts with sentinel://"),
        ("sentinel://h1/0?ssl_cert_reqs=required", "TLS through Sentinel"),
    ],
)
def test_a_bad_sentinel_url_is_a_configuration_error(url: str, message: str) -> None:
    with pytest.raises(RedisConfigError, match=message):
        parse_sentinel_url(url)


def test_the_broker_url_names_the_database_and_credentials_on_every_part() -> None:
    url = "sentinel://:p%40ss@h1;sentinel://h2:26380/3?socket_timeout=1"
    broker = "sentinel://:p%40ss@h1:26379/3;sentinel://:p%40ss@h2:26380/3"
    assert build_broker_url(url) == build_sentinel_broker_url(url) == broker
    # kombu and Celery read the database and password from the first part only: it has them now.
    connection = Connection(broker)
    assert connection.alt == broker.split(";")
    assert (connection.virtual_host, connection.password) == ("3", "p@ss")
    backend = SentinelBackend(app=create_app(WorkerSettings(redis_master_name="m")), url=broker)
    assert (backend.connparams["db"], backend.connparams["password"]) == (3, "p@ss")
    assert [(h["host"], h["port"]) for h in backend.connparams["hosts"]] == [("h1", 26379), ("h2", 26380)]


def test_the_broker_and_the_backend_are_told_the_master_name() -> None:
    settings = WorkerSettings(redis_url=URL, redis_master_name="mymaster", visibility_timeout_s=60)
    config = build_celery_config(settings)
    assert config["broker_transport_options"] == {
        "visibility_timeout": 60,
        "master_name": "mymaster",
        "priority_steps": list(PRIORITY_STEPS),
        "body_encoding": BODY_ENCODING,
    }
    assert config["result_backend_transport_options"]["master_name"] == "mymaster"
    assert config["result_backend"] == "sentinel://h1:26379/0;sentinel://h2:26380/0"
    app = create_app(settings)
    assert app.conf.broker_url == config["result_backend"]
    assert app.conf.broker_transport_options["master_name"] == "mymaster"
    # A plain Redis URL gets no Sentinel option.
    plain = build_celery_config(WorkerSettings(redis_url="redis://h/0"))
    assert "master_name" not in plain["broker_transport_options"]


def test_the_master_name_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MASTER_NAME_VARIABLE, "from-env")
    monkeypatch.setenv("TOOLLOOP_REDIS_URL", URL)
    assert WorkerSettings().redis_master_name == "from-env"
    assert build_celery_config(WorkerSettings())["broker_transport_options"]["master_name"] == "from-env"
    client = connect_redis(URL)
    try:
        assert client.connection_pool.service_name == "from-env"
    finally:
        client.close()


def test_a_sentinel_url_without_a_master_name_fails_at_startup() -> None:
    settings = WorkerSettings(redis_url=URL)
    with pytest.raises(RedisConfigError, match=MASTER_NAME_VARIABLE) as raised:
        create_app(settings)
    assert isinstance(raised.value, ToolloopError)
    with pytest.raises(RedisConfigError, match=MASTER_NAME_VARIABLE):
        connect_redis(URL)
    with pytest.raises(RedisConfigError, match=MASTER_NAME_VARIABLE):
        connect_redis_async(URL)


def test_the_sync_client_is_one_of_the_current_master() -> None:
    client = connect_redis(
        "sentinel://:pw@h1;sentinel://h2/4?socket_timeout=1", master_name="mymaster", decode_responses=False
    )
    try:
        assert isinstance(client, SentinelRedis)
        pool = client.connection_pool
        assert isinstance(pool, MasterCheckingPool)
        assert (pool.service_name, pool.is_master) == ("mymaster", True)
        kwargs = pool.connection_kwargs
        assert (kwargs["db"], kwargs["password"], kwargs["decode_responses"]) == (4, "pw", False)
        # The URL's socket timeout reaches the master's connections and the sentinels' sockets.
        assert kwargs["socket_timeout"] == 1
        assert client.sentinels is not None
        assert [s.connection_pool.connection_kwargs["port"] for s in client.sentinels.sentinels] == [
            26379
        ] * 2
        assert block_cap_ms(client) == 400
    finally:
        client.close()


async def test_the_async_client_is_one_of_the_current_master() -> None:
    client = connect_async(URL, master_name="mymaster")
    try:
        assert isinstance(client, AsyncSentinelRedis)
        assert isinstance(client.connection_pool, AsyncMasterCheckingPool)
        assert client.connection_pool.connection_kwargs["decode_responses"] is True
        # redis-py's own default socket timeout (5 s) on a Sentinel pool: reads block up to the cap.
        assert block_cap_ms(client) == MAX_BLOCK_MS
    finally:
        await client.aclose()
    sync = connect_sync(URL, master_name="mymaster")
    sync.close()


def test_flower_sees_the_sentinel_broker_with_its_master() -> None:
    app = create_app(WorkerSettings(redis_url="sentinel://:pw@h1;sentinel://h2/2", redis_master_name="m"))
    with app.connection() as connection:
        uri = connection.as_uri(include_password=True)
        shown = connection.as_uri()
    assert "pw" not in shown
    broker = Broker(uri, broker_options=app.conf.broker_transport_options)
    assert isinstance(broker, RedisSentinel)
    assert (broker.master_name, broker.vhost, broker.password) == ("m", 2, "pw")


def test_producer_apps_differ_by_master_name() -> None:
    first = get_producer_app(Settings(redis_url=URL, redis_master_name="a"))
    second = get_producer_app(Settings(redis_url=URL, redis_master_name="b"))
    assert first is not second
    assert first.conf.broker_transport_options["master_name"] == "a"
    assert second.conf.broker_transport_options["master_name"] == "b"


def test_kombu_never_switches_between_the_parts_of_a_sentinel_url() -> None:
    # Each part is one of the sentinels the channel already asks; a switch would only close the connection
    # under the consumer's channels (the next lost connection then killed the worker).
    settings = WorkerSettings(redis_url=URL, redis_master_name="m")
    app = create_app(settings)
    connection = app.connection_for_write()
    assert connection.alt == ["sentinel://h1:26379/0", "sentinel://h2:26380/0"]
    connection.maybe_switch_next()
    assert (connection.hostname, connection.port) == ("h1", 26379)
    assert "broker_failover_strategy" not in build_celery_config(
        WorkerSettings(redis_url="redis://a/0;redis://b/0")
    )
