"""The broker URL derived from the state Redis URL keeps only the query options kombu understands."""

from __future__ import annotations

import ssl

import pytest
from kombu import Connection

from workers.app import build_celery_config, create_app
from workers.settings import WorkerSettings as Settings
from workers.settings import build_broker_url

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("redis_url", "broker_url"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/0?socket_timeout=1", "redis://127.0.0.1:6379/0"),
        (
            "redis://:p%40ss@h:6380/2?socket_timeout=1&health_check_interval=10&socket_keepalive=true",
            "redis://:p%40ss@h:6380/2",
        ),
        (
            "rediss://u:pw@h:6380/0?socket_timeout=1.5&ssl_cert_reqs=required&ssl_ca_certs=%2Fca.pem",
            "rediss://u:pw@h:6380/0?ssl_cert_reqs=required&ssl_ca_certs=%2Fca.pem",
        ),
        ("amqp://guest@h:5672//?heartbeat=30", "amqp://guest@h:5672//?heartbeat=30"),
    ],
)
def test_build_broker_url(redis_url: str, broker_url: str) -> None:
    assert build_broker_url(redis_url) == broker_url


def test_kombu_accepts_the_derived_url_and_keeps_its_ssl_options() -> None:
    url = "rediss://u:pw@h:6380/0?socket_timeout=1&ssl_cert_reqs=none&ssl_ca_certs=%2Fca.pem"
    with pytest.raises(TypeError, match="socket_timeout"):
        Connection(url)  # the bug this guards against: kombu refuses redis-py's own options
    connection = Connection(build_broker_url(url))
    assert connection.ssl == {"ssl_cert_reqs": ssl.CERT_NONE, "ssl_ca_certs": "/ca.pem"}


def test_an_explicit_broker_url_is_used_as_given() -> None:
    settings = Settings(redis_url="redis://h/0?socket_timeout=1", broker_url="redis://b/1?x=1")
    assert settings.effective_broker_url == "redis://b/1?x=1"


def test_the_app_gets_the_derived_broker_and_the_full_backend_url() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:6379/3?socket_timeout=2")
    app = create_app(settings)
    assert app.conf.broker_url == "redis://127.0.0.1:6379/3"
    # The result backend is redis-py's own URL parser: it keeps the option.
    assert build_celery_config(settings)["result_backend"] == settings.redis_url
