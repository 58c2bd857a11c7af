"""The ``rlconnect`` command: collect experience from an env and show what happened.

rlconnect sample  [--env CartPole-v1] [--num-envs 8] [--steps 20000] [--policy random|mlp]
                  [--observation-filter MeanStdFilter] [--config run.toml] [--seed 0]
                  [--out DIR] [--plot returns.png]
rlconnect inspect PATH   (a saved pipeline, batch files or folder, a checkpoint, a run folder)

``sample`` collects with the default pipelines, draws a progress bar on stderr and prints a
summary table on stdout. Settings come from, highest first: the flags, the ``--config``
TOML file (keys of ``RunnerConfig`` plus ``env``, ``steps``, ``policy``), the defaults.
``--out DIR`` writes every batch to ``DIR/batch-NNNNNN.rlb`` (read them back with
``rc.read_batches(DIR)``), the runner's checkpoint to ``DIR/checkpoint`` and the run's
settings and summary to ``DIR/run.json``.

Exit codes: 0 done, 1 a failure while running (one line; ``--traceback`` shows it all),
2 bad arguments, config file, env id or path (one line), 130 interrupted.
"""

from rlconnect.cli.app import build_parser, main
from rlconnect.cli.describe import cmd_inspect, describe_path, peek_format, render
from rlconnect.cli.errors import UsageError
from rlconnect.cli.progress import Progress, time_shares
from rlconnect.cli.sample import cmd_sample
from rlconnect.cli.settings import DEFAULTS, build_runner, resolve_env, resolve_settings

__all__ = [
    "DEFAULTS",
    "Progress",
    "UsageError",
    "build_parser",
    "build_runner",
    "cmd_inspect",
    "cmd_sample",
    "describe_path",
    "main",
    "peek_format",
    "render",
    "resolve_env",
    "resolve_settings",
    "time_shares",
]
