"""The argument parser of the ``rlconnect`` command and its entry point, ``main``."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from rlconnect.cli.describe import cmd_inspect
from rlconnect.cli.errors import UsageError, missing_extra
from rlconnect.cli.export import add_export_parser
from rlconnect.cli.imports import add_import_option, import_user_modules
from rlconnect.cli.sample import cmd_sample
from rlconnect.cli.serve import add_serve_parser


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (plus where to find help), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not >= 0")
    return value


def _version() -> str:
    from rlconnect._version import __version__

    return __version__


def _unregistered(exc: BaseException) -> bool:
    """True for a policy kind, connector or lambda this process has not registered."""
    from rlconnect.errors import UnknownConnectorError
    from rlconnect.policy.registry import UnknownPolicyError

    return isinstance(exc, UnknownPolicyError | UnknownConnectorError)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command: ``sample``, ``inspect``, ``export``, ``serve``."""
    parser = _Parser(
        prog="rlconnect",
        description="Collect reinforcement-learning experience from an env and show what happened.",
        epilog="exit codes: 0 done, 1 a failure while running, 2 bad arguments or paths, "
        "130 interrupted",
    )
    parser.add_argument("--version", action="version", version=f"rlconnect {_version()}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _add_sample_parser(sub)
    _add_inspect_parser(sub)
    add_export_parser(sub)
    add_serve_parser(sub)
    return parser


def _add_sample_parser(sub: Any) -> None:
    """``rlconnect sample``: what to sample with, then what to write and show."""
    s = sub.add_parser(
        "sample",
        help="collect experience, show progress and a summary",
        description="Collect experience with the default pipelines. Flags override the "
        "--config file, which overrides the defaults.",
    )
    s.add_argument("--env", help="gymnasium id or module:function env creator (CartPole-v1)")
    s.add_argument("--num-envs", type=_positive_int, help="sub-environments (8)")
    s.add_argument(
        "--env-workers",
        type=_positive_int,
        metavar="W",
        help="step the sub-envs in W worker processes (num_env_workers; default: in this process)",
    )
    s.add_argument("--steps", type=_positive_int, help="env steps to collect (20000)")
    s.add_argument(
        "--fragment", type=_positive_int, help="rollout_fragment_length (200, less for short runs)"
    )
    s.add_argument("--policy", choices=("random", "mlp"), help="policy (mlp)")
    s.add_argument("--observation-filter", choices=("NoFilter", "MeanStdFilter"), help="(NoFilter)")
    s.add_argument(
        "--preset", choices=("atari",), help="preprocessing for image envs (ALE/Pong-v5)"
    )
    s.add_argument("--config", metavar="TOML", help="file of RunnerConfig keys, env, steps, policy")
    s.add_argument("--seed", type=_seed, help="base seed (0)")
    _add_sample_outputs(s)
    add_import_option(s)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--traceback", action="store_true", help="show the traceback of a failure")
    s.set_defaults(func=cmd_sample)


def _add_sample_outputs(s: argparse.ArgumentParser) -> None:
    """What ``rlconnect sample`` writes: ``--out``, ``--format``, ``--plot``, ``--log-dir``."""
    s.add_argument(
        "--out", metavar="DIR", help="write batch files, a checkpoint and run.json to DIR"
    )
    s.add_argument(
        "--format",
        choices=("parquet", "rlb"),
        help="batch files of --out (parquet when pyarrow is installed, else rlb)",
    )
    s.add_argument(
        "--plot", metavar="FILE", help="plot episode returns to a .png, .svg or .pdf (matplotlib)"
    )
    s.add_argument(
        "--log-dir",
        metavar="DIR",
        help="log metrics() per batch to DIR: metrics.jsonl, metrics.csv and TensorBoard "
        "event files (when tensorboard is installed)",
    )


def _add_inspect_parser(sub: Any) -> None:
    """``rlconnect inspect PATH``."""
    i = sub.add_parser(
        "inspect",
        help="show a saved pipeline, batch files, a checkpoint or a run folder",
    )
    i.add_argument("path")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_import_option(i)
    i.add_argument("--traceback", action="store_true", help="show the traceback of a failure")
    i.set_defaults(func=cmd_inspect)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlconnect`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a bare ``rlconnect`` shows what it can do
        parser.print_help()
        return 0
    prog = f"rlconnect {args.command}"
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        import_user_modules(getattr(args, "imports", []))
        return int(func(args))
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rlconnect inspect run | head`: the reader left, say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 1
    except Exception as exc:  # one line, not a traceback, unless asked for
        if _unregistered(exc):  # fixed by an argument: --import the registering module
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        if args.traceback or os.environ.get("RLCONNECT_TRACEBACK"):
            traceback.print_exc()
        else:
            msg = str(exc).splitlines()[0] if str(exc) else ""
            print(
                f"{prog}: failed: {type(exc).__name__}: {msg}{missing_extra(exc)} "
                "(--traceback shows where)",
                file=sys.stderr,
            )
        return 1
