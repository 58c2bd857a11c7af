"""The ``rlconnect`` command: collect experience from an env and show what happened.

rlconnect sample  [--env CartPole-v1] [--num-envs 8] [--steps 20000] [--policy random|mlp]
                  [--observation-filter MeanStdFilter] [--preset atari] [--config run.toml]
                  [--seed 0] [--out DIR [--format parquet|rlb]] [--plot returns.svg]
rlconnect inspect PATH   (a saved pipeline, batch files or folder, a checkpoint, a run folder,
                          an exported policy file or ONNX model)
rlconnect export RUN_OR_CHECKPOINT --out FILE [--onnx FILE] [--policy ID]
rlconnect serve POLICY_FILE [--host 127.0.0.1] [--port 9900]   (rc.serve.PolicyServer)
rlconnect --version      (also: python -m rlconnect ...; a bare ``rlconnect`` prints help)

``sample`` collects with the default pipelines, draws progress on stderr (rich) and prints a
summary table on stdout. Every command takes ``--import MODULE`` (repeatable): it imports
the module that registers your policy kinds, connectors or env ids before anything is
loaded. ``--env`` is a gymnasium id or ``module:function``, a function of
no argument or of the env context (modules in the current folder are importable) returning
a gymnasium env, an ``rc.MultiAgentEnv`` or a PettingZoo Parallel or AEC env: agents with
the same spaces share one default policy, one policy per distinct pair of spaces. Settings
come from, highest first: the flags, the ``--config`` TOML file (keys of ``RunnerConfig``
plus ``env``, ``steps``, ``policy``), the defaults. ``--out DIR`` writes every batch to
Parquet files (``.rlb`` files without pyarrow, or with ``--format rlb``; read either back
with ``rc.read_batches(DIR)``), the runner's checkpoint to ``DIR/checkpoint`` and the run's
settings and summary to ``DIR/run.json``. Every path is checked before sampling starts.

Exit codes: 0 done, 1 a failure while running (one line; ``--traceback`` shows it all),
2 bad arguments, config file, env or path, or a missing extra (one line, naming its
``pip install`` command), 130 interrupted (Ctrl-C; the ``--out`` folder then holds what
was collected and ``run.json`` says the run was interrupted).
"""

from rlconnect.cli.app import build_parser, main
from rlconnect.cli.build import build_runner
from rlconnect.cli.describe import cmd_inspect, describe_path, peek_format, render
from rlconnect.cli.errors import UsageError
from rlconnect.cli.progress import Progress, time_shares
from rlconnect.cli.sample import cmd_sample
from rlconnect.cli.settings import DEFAULTS, resolve_env, resolve_settings

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
