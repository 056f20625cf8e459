"""Is a Ray cluster there? `ray.init(address=...)` waits without end when nothing answers, so a
TCP connection and a gRPC handshake check `--address` first, within a time limit.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional

TIMEOUT_VARIABLE = "SPACY_ELMO_RAY_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT = 10.0
RAY_CLIENT_PORT = 10001  # Ray's default for `ray://host`


def connect_timeout() -> float:
    """Seconds the check waits for an answer: SPACY_ELMO_RAY_CONNECT_TIMEOUT, else 10."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r} is not a positive number of seconds")
    return value


def check_ray_address(address: str) -> None:
    """ValueError naming `address` unless a gRPC server (a Ray cluster's GCS or a Ray client
    server) answers there within `connect_timeout()` seconds. Addresses Ray resolves itself
    ("auto") are resolved first; a form this cannot read is left to Ray."""
    timeout = connect_timeout()
    endpoint = _endpoint(_resolve(address))
    if endpoint is None:
        return
    host, port = endpoint
    deadline = time.monotonic() + timeout
    hint = f"is a Ray cluster running there (`ray start --head`)? ({TIMEOUT_VARIABLE}={timeout:g}s)"
    try:  # a refused connection is said at once, where gRPC would try again until the timeout
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, socket.timeout) else error.strerror or error
        raise ValueError(f"cannot join the Ray cluster at {address}: {reason}; {hint}") from None
    if os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true"):
        return  # a TLS cluster: a plain gRPC channel cannot tell
    import grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with grpc.insecure_channel(target) as channel:
        try:
            ready = grpc.channel_ready_future(channel)
            ready.result(timeout=max(0.001, deadline - time.monotonic()))
        except grpc.FutureTimeoutError:
            raise ValueError(
                f"cannot join the Ray cluster at {address}: {host}:{port} accepts connections "
                f"but nothing answered a gRPC handshake within {timeout:g}s; {hint}"
            ) from None


def _resolve(address: str) -> str:
    if address.strip() != "auto":
        return address.strip()
    try:  # Ray's own lookup of the latest `ray start` cluster
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address("auto") or address
    except Exception:  # noqa: BLE001 - none found, or another Ray: Ray's own error follows
        return address


def _endpoint(address: str) -> Optional[tuple[str, int]]:
    """(host, port) of `host:port`, `ray://host:port` or `[v6]:port`; None for other forms."""
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    if "://" in rest or "/" in rest:
        return None
    if client and not rest.endswith("]") and ":" not in rest:
        rest += f":{RAY_CLIENT_PORT}"
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or not host or not 0 < int(port) < 65536:
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)
