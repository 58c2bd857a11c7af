"""What the serving tests share: a thread that drives a server's runner, and a raw POST
that bypasses ``PolicyClient`` (its checks and retries) to send what a hostile client
would and read the server's own answer."""

from __future__ import annotations

import http.client
import threading
from typing import Any

from rlconnect.errors import EnvError
from rlconnect.serve import PolicyServer
from rlconnect.serve.wire import decode, encode

MSGPACK = "application/x-msgpack"


def sample_forever(
    server: PolicyServer,
    batches: list[Any] | None = None,
    errors: list[BaseException] | None = None,
) -> threading.Thread:
    """A started daemon thread named ``sampler`` calling ``server.runner.sample()`` until
    the server stops (``EnvError``), appending each batch to ``batches``; another exception
    ends it too, kept in ``errors`` when given (else raised in the thread)."""

    def run() -> None:
        while True:
            try:
                batch = server.runner.sample()
            except EnvError:  # stopped
                return
            except Exception as exc:
                if errors is None:
                    raise
                errors.append(exc)
                return
            if batches is not None:
                batches.append(batch)

    thread = threading.Thread(target=run, daemon=True, name="sampler")
    thread.start()
    return thread


def raw_post(
    port: int, name: str, body: dict | bytes, content_type: str | None = MSGPACK
) -> tuple[int, Any]:
    """``(status, decoded answer)`` of one POST to ``/v1/name`` on 127.0.0.1 (a dict body
    is msgpack-encoded; bytes go as they are; ``content_type=None`` sends no header)."""
    data = encode(body) if isinstance(body, dict) else body
    headers = {} if content_type is None else {"Content-Type": content_type}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", f"/v1/{name}", data, headers)
        resp = conn.getresponse()
        return resp.status, decode(resp.read())
    finally:
        conn.close()
