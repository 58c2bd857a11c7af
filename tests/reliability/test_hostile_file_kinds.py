"""Hostile files that are not damaged bytes: a path naming a folder, a FIFO, a device or a
sparse giant, and a small file whose config declares a huge network.

Every loader of files (``load_policy``, ``read_policy_file``, ``describe_policy_file``,
``rlconnect inspect``, ``load_pipeline``, ``load_statistics``, ``read_batches``,
``summarize_batches``, ``describe_onnx_file``, checkpoint restore and ``from_checkpoint``,
``export_policy`` from a checkpoint, ``--config``) must answer each with its documented
error, promptly and within little memory: nothing is read from a special file (a FIFO
would block forever, ``/dev/zero`` never ends) and no network is built before the weights
it declares are checked against the stored ones. Each load runs in a thread with a
deadline (a hang fails the test instead of stalling it) under the fuzz ``Guard``, with the
process's resident memory sampled beside it; ``RLCONNECT_WRITE_FIGURES=1`` writes the
time and memory of every load to ``file_kind_figures.json`` for docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fuzz_common as fc
import gymnasium as gym
import numpy as np
import pytest
import safetensors.numpy

import rlconnect as rc
from machine_speed import scaled
from rlconnect.checkpoints import POLICY_FILE, load_checkpoint, load_statistics
from rlconnect.checkpoints.container import _digest
from rlconnect.checkpoints.files import MAX_FILE_BYTES
from rlconnect.cli.app import main as cli_main
from rlconnect.cli.describe import describe_path, render
from rlconnect.cli.errors import UsageError
from rlconnect.deploy.onnx_file import describe_onnx_file
from rlconnect.deploy.policy_file import describe_policy_file, read_policy_file
from rlconnect.offline import summarize_batches

pytestmark = pytest.mark.reliability

FIGURES_PATH = Path(__file__).with_name("file_kind_figures.json")
DEADLINE_S = 20.0
"""A load that has not answered by then hangs (it should answer within milliseconds)."""
SECONDS_BOUND = 5.0
"""What a refused load may take on a loaded 2-core CI machine (it takes milliseconds)."""
RSS_BOUND = 64 << 20
"""Resident memory a refused load may add (torch's allocations are not traced)."""
FIGURES: dict[str, dict[str, Any]] = {}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _unblock(path: Path) -> None:
    """Release a reader stuck opening or reading the FIFO at ``path`` (a writer that
    opens and closes at once gives it an end of file)."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def bounded(
    guard: fc.Guard, name: str, load: Callable[[], Any], fifo: Path | None = None
) -> tuple[str, float]:
    """Run ``load`` under ``guard`` in a thread with a deadline and RSS sampling; returns
    the outcome and the seconds it took; records the figures under ``name``."""
    result: dict[str, Any] = {}
    base = _rss()
    peak = [base]

    def run() -> None:
        t0 = time.perf_counter()
        try:
            result["outcome"] = guard.run(load, name, kind=name.split(":")[0])
        except BaseException as exc:  # reported below, in the test's thread
            result["error"] = exc
        result["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + scaled(DEADLINE_S)
    while thread.is_alive() and time.monotonic() < deadline:
        peak[0] = max(peak[0], _rss())
        thread.join(0.005)
    if thread.is_alive():
        if fifo is not None:
            _unblock(fifo)
        pytest.fail(f"{name}: no answer within {DEADLINE_S} s (it hangs)")
    if "error" in result:
        raise result["error"]
    grown = peak[0] - base
    FIGURES[name] = {
        "outcome": result["outcome"],
        "ms": round(result["seconds"] * 1000, 1),
        "traced_peak_kb": round(guard.last_peak / 1024),
        "rss_growth_mb": round(grown / 2**20, 1),
    }
    assert result["outcome"] != "accepted", f"{name}: accepted"
    assert result["seconds"] < scaled(SECONDS_BOUND), f"{name}: took {result['seconds']:.1f} s"
    assert grown < RSS_BOUND, f"{name}: resident memory grew by {grown / 2**20:.0f} MB"
    return result["outcome"], result["seconds"]


class Files:
    """Valid files of every kind a loader reads, and one Guard per loader."""

    def __init__(self, root: Path) -> None:
        self.root, self.marker_dir = root, root / "canary"
        self.marker_dir.mkdir()
        env = gym.make("CartPole-v1")
        policy = rc.MLPPolicy(env.observation_space, env.action_space, hiddens=(8,), seed=0)
        config = rc.RunnerConfig(
            rollout_fragment_length=8, seed=0, observation_filter="MeanStdFilter"
        )
        self.runner = rc.EnvRunner("CartPole-v1", policy, config=config)
        self.runner.sample()
        self.policy_file = root / "valid.policy"
        rc.export_policy(self.runner, self.policy_file)
        self.checkpoint = root / "checkpoint"
        self.runner.save_checkpoint(self.checkpoint)
        self.pipeline = root / "pipeline"
        rc.save_pipeline(self.runner.agent_pipeline(), self.pipeline)
        self.guards: dict[str, fc.Guard] = {}
        for path in (self.policy_file, self.checkpoint, self.pipeline):  # warm-up imports
            render(describe_path(str(path)))
        rc.load_policy(self.policy_file).compute_action(np.zeros(4, np.float32))
        rc.EnvRunner.from_checkpoint(self.checkpoint, env="CartPole-v1")
        self.onnx = importlib.util.find_spec("onnx") is not None
        if self.onnx:
            with pytest.raises(rc.CheckpointError):  # (imports onnx: not an ONNX file)
                describe_onnx_file(self.pipeline)

    def guard(self, loader: str) -> fc.Guard:
        allowed = (rc.CheckpointError, UsageError, rc.UnknownPolicyError)
        if loader not in self.guards:
            self.guards[loader] = fc.Guard(f"file_kinds:{loader}", allowed, self.marker_dir)
        return self.guards[loader]

    def loaders(self, path: Path) -> dict[str, Callable[[], Any]]:
        """Every loader that takes a file path, aimed at ``path``."""
        ctx = rc.ConnectorContext.from_policy(self.runner.policies["default_policy"])
        loads: dict[str, Callable[[], Any]] = {
            "load_policy": lambda: rc.load_policy(path),
            "read_policy_file": lambda: read_policy_file(path),
            "describe_policy_file": lambda: describe_policy_file(path),
            "inspect": lambda: render(describe_path(str(path))),
            "load_pipeline": lambda: rc.load_pipeline(path, ctx),
            "load_statistics": lambda: load_statistics(path),
            "read_batches": lambda: list(rc.read_batches(path)),
            "summarize_batches": lambda: summarize_batches(path),
            "cli_inspect": lambda: _cli(["inspect", str(path)], CLI_CHECKPOINT_ERROR),
        }
        if self.onnx:
            loads["describe_onnx_file"] = lambda: describe_onnx_file(path)
        return loads


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Iterator[Files]:
    yield Files(tmp_path_factory.mktemp("hostile_file_kinds"))
    if os.environ.get("RLCONNECT_WRITE_FIGURES") == "1":
        FIGURES_PATH.write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


def _special(kind: str, path: Path) -> Path:
    """A ``kind`` of non-regular file at ``path``."""
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero_symlink":
        path.symlink_to("/dev/zero")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "sparse_giant":
        with open(path, "wb") as f:
            f.truncate(MAX_FILE_BYTES + 1)
    return path


SPECIAL = ["folder", "fifo", "dev_zero_symlink", "socket", "sparse_giant"]
FOLDER_LOADERS = ("inspect", "cli_inspect", "read_batches", "summarize_batches")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev/zero are POSIX")
@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_are_refused_unread_by_every_loader(files: Files, kind: str) -> None:
    path = _special(kind, files.root / kind)
    try:
        for loader, load in files.loaders(path).items():
            if kind == "folder" and loader in FOLDER_LOADERS:
                continue  # (a folder of batch files is what they take)
            outcome, _ = bounded(files.guard(loader), f"{kind}:{loader}", load, fifo=path)
            assert outcome in ("CheckpointError", "OfflineDataError", "UsageError"), outcome
    finally:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev/zero are POSIX")
@pytest.mark.parametrize("kind", ["fifo", "dev_zero_symlink", "folder", "sparse_giant"])
@pytest.mark.parametrize("role", ["manifest.json", "policies/default_policy/weights.safetensors"])
def test_special_files_inside_a_checkpoint(files: Files, kind: str, role: str) -> None:
    ck = files.root / "ck_special"
    shutil.copytree(files.checkpoint, ck)
    try:
        os.remove(ck / role)
        _special(kind, ck / role)
        runner = files.runner
        loads = {
            "restore": lambda: runner.restore(ck),
            "from_checkpoint": lambda: rc.EnvRunner.from_checkpoint(ck, env="CartPole-v1"),
            "load_checkpoint": lambda: load_checkpoint(ck),
            "export_policy": lambda: rc.export_policy(ck, files.root / "exported"),
            "cli_inspect": lambda: _cli(["inspect", str(ck)], CLI_CHECKPOINT_ERROR),
        }
        for loader, load in loads.items():
            where = "manifest" if role == "manifest.json" else "weights"
            outcome, _ = bounded(
                files.guard(loader), f"{kind}_{where}:{loader}", load, fifo=ck / role
            )
            assert outcome in ("CheckpointError", "UsageError"), (loader, outcome)
    finally:
        shutil.rmtree(ck)


CLI_USAGE_ERROR, CLI_CHECKPOINT_ERROR = 2, 1


def _cli(argv: list[str], refused: int) -> None:
    """Run the command line; its exit status ``refused`` becomes ``UsageError`` (what the
    ``Guard`` counts as refused), any other status is returned as accepted."""
    if cli_main(argv) == refused:
        raise UsageError(f"exit status {refused}")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_as_the_cli_config_file_is_a_usage_error(files: Files, capsys) -> None:
    path = _special("fifo", files.root / "config.toml")
    try:
        argv = ["sample", "--config", str(path), "--steps", "1"]
        load = lambda: _cli(argv, CLI_USAGE_ERROR)  # noqa: E731
        bounded(files.guard("cli_config"), "fifo:--config", load, fifo=path)
        assert "not a regular file" in capsys.readouterr().err
    finally:
        path.unlink()


# -- architectures declared far larger than the stored weights --------------------------


def repack_policy_file(data: bytes, edit: Callable[[dict], None]) -> bytes:
    """The policy file with its JSON structure edited and a valid digest."""
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    structure = json.loads(meta["structure"])
    edit(structure)
    text = json.dumps(structure)
    arrays = safetensors.numpy.load(data)
    metadata = {**meta, "structure": text, "sha256": _digest(POLICY_FILE.name, 1, text, arrays)}
    return safetensors.numpy.save(arrays, metadata=metadata)


HUGE_CONFIGS = {
    "hiddens_4096x4096": {"hiddens": [4096, 4096]},
    "hiddens_4096x4096_vf": {"hiddens": [4096, 4096], "vf_head": True},
    "hiddens_8x100000": {"hiddens": [8] * 100_000},
    "hiddens_10^9": {"hiddens": [10**9]},
}


@pytest.mark.parametrize("name", sorted(HUGE_CONFIGS))
def test_a_policy_file_declaring_a_huge_network_is_refused_before_building(
    files: Files, name: str
) -> None:
    data = repack_policy_file(
        files.policy_file.read_bytes(), lambda s: s["policy"]["config"].update(HUGE_CONFIGS[name])
    )
    path = files.root / f"{name}.policy"
    path.write_bytes(data)
    for loader in ("load_policy", "inspect"):
        load = files.loaders(path)[loader]
        if loader == "inspect":  # shows the file without building it: accepted
            render(describe_path(str(path)))
            continue
        outcome, _ = bounded(files.guard(loader), f"declared_{name}:{loader}", load)
        assert outcome == "CheckpointError"
    with pytest.raises(rc.CheckpointError, match="declares"):
        rc.load_policy(path)


@pytest.mark.parametrize("name", sorted(HUGE_CONFIGS))
def test_a_checkpoint_declaring_a_huge_network_is_refused_before_building(
    files: Files, name: str
) -> None:
    ck = files.root / "ck_huge"
    shutil.copytree(files.checkpoint, ck)
    try:
        manifest = json.loads((ck / "manifest.json").read_text())
        manifest["policies"][0]["spec"]["kwargs"].update(HUGE_CONFIGS[name])
        (ck / "manifest.json").write_text(json.dumps(manifest))
        loads = {
            "from_checkpoint": lambda: rc.EnvRunner.from_checkpoint(ck, env="CartPole-v1"),
            "export_policy": lambda: rc.export_policy(ck, files.root / "exported"),
        }
        for loader, load in loads.items():
            outcome, _ = bounded(files.guard(loader), f"declared_{name}:{loader}", load)
            assert outcome == "CheckpointError"
        with pytest.raises(rc.CheckpointError, match="declares"):
            rc.EnvRunner.from_checkpoint(ck, env="CartPole-v1")
    finally:
        shutil.rmtree(ck)
