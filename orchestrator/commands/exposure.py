"""Serving on an address other machines reach: only with authentication, unless the operator says otherwise.

`toolloop api` and `toolloop flower` both answer requests that act (submit a turn, call a tool, revoke a
task). On a loopback address only this machine reaches them, which is the development default; bound to
anything else (`0.0.0.0` in a container, a public interface) they refuse to start without authentication
unless the operator opts out explicitly — in one line that says how to do either.
"""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback_host(host: str) -> bool:
    """True for an address only this machine reaches: `localhost`, 127.0.0.0/8, `::1`.

    A host name other than localhost counts as reachable from elsewhere: it may resolve to any interface.
    """
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def build_exposure_refusal(
    *, what: str, host: str, authenticated: bool, allowed_open: bool, how_to_authenticate: str, opt_out: str
) -> str | None:
    """Why `what` must not start bound to `host`, as one line; None when it may.

    It may when it is `authenticated`, when `host` is loopback, or when the operator `allowed_open` it.
    """
    if authenticated or allowed_open or is_loopback_host(host):
        return None
    return (
        f"refusing to serve {what} on {host} without authentication: {how_to_authenticate} "
        f"(or bind 127.0.0.1; to serve it open on purpose: {opt_out})"
    )
