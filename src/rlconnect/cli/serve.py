"""``rlconnect serve``: answer actions of an exported policy file over HTTP.

    rlconnect serve POLICY_FILE [--host 127.0.0.1] [--port 9900] [--max-concurrent N]
                                [--import MODULE]

loads the file with ``rc.load_policy`` (as exported: no exploration, statistics frozen)
and serves it with ``rc.serve.PolicyServer`` until interrupted (Ctrl-C or SIGTERM, exit
0). Clients use ``rc.serve.PolicyClient(url)``, or any HTTP client with msgpack bodies
(``GET /v1/health`` answers JSON). The first line printed is ``serving ... at URL``, so a
script can start it with ``--port 0`` and read the port. A path that is not a policy file
is a usage error (exit 2, one line); a damaged file ends in its ``CheckpointError`` (exit 1).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from rlconnect.cli.errors import UsageError
from rlconnect.cli.imports import add_import_option

__all__ = ["add_serve_parser", "cmd_serve"]


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0-65535; 0 picks a free one)")
    return value


def add_serve_parser(sub: Any) -> None:
    """Add the ``serve`` command to the subparsers ``sub``."""
    s = sub.add_parser(
        "serve",
        help="serve an exported policy file over HTTP (rc.serve.PolicyServer)",
        description="Serve the actions of a policy file written by rlconnect export (or "
        "rc.export_policy), exactly as exported, until interrupted. Only bind to addresses "
        "you trust.",
    )
    s.add_argument("policy_file", metavar="POLICY_FILE")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    s.add_argument("--port", type=_port, default=9900, help="port (9900; 0 picks a free one)")
    s.add_argument(
        "--max-concurrent", type=int, default=100, metavar="N", help="sessions at once (100)"
    )
    add_import_option(s)
    s.add_argument("--traceback", action="store_true", help="show the traceback of a failure")
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted; 0 once stopped."""
    from rlconnect.deploy import load_policy
    from rlconnect.serve import PolicyServer

    if not os.path.isfile(args.policy_file):
        raise UsageError(f"{args.policy_file!r} is not a file; give a file rlconnect export wrote")
    if args.max_concurrent < 1:
        raise UsageError(f"--max-concurrent {args.max_concurrent}: it must be >= 1")
    policy = load_policy(args.policy_file)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        server = PolicyServer(policy, args.host, args.port, max_concurrent=args.max_concurrent)
    except OSError as exc:
        signal.signal(signal.SIGTERM, previous)
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    print(f"serving {args.policy_file} at {server.url} (GET /v1/health; Ctrl-C stops)", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
    print("stopped", flush=True)
    return 0
