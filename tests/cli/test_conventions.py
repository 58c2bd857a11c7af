"""The command as a user runs it (``python -m rlconnect``, a subprocess): its version,
env creators, a policy per pair of spaces, hints, exit codes and one-line errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.cli.conftest import run_cli

from machine_speed import scaled

HERE = Path(__file__).resolve().parent
SMALL = ["--steps", "200", "--num-envs", "2", "--quiet"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A user's folder holding their env module (not on PYTHONPATH)."""
    shutil.copy(HERE / "user_envs.py", tmp_path / "my_envs.py")
    return tmp_path


def test_version_and_bare_command() -> None:
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == "rlconnect 0.1.0"
    done = run_cli()
    assert done.returncode == 0 and done.stdout.startswith("usage: rlconnect")
    assert "sample" in done.stdout and "inspect" in done.stdout and done.stderr == ""


@pytest.mark.parametrize("creator", ["my_envs:cartpole", "my_envs:cartpole_ctx"])
def test_creators_with_zero_or_one_argument_from_the_current_folder(workdir, creator) -> None:
    done = run_cli("sample", "--env", creator, *SMALL, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert creator in done.stdout and "env steps" in done.stdout


def test_a_creator_with_two_arguments_is_a_usage_error(workdir) -> None:
    done = run_cli("sample", "--env", "my_envs:two_args", *SMALL, cwd=workdir)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no argument or one" in done.stderr


@pytest.mark.parametrize("creator", ["pettingzoo.classic.rps_v2:env", "rps_parallel"])
def test_pettingzoo_agents_with_the_same_spaces_share_one_policy(workdir, creator) -> None:
    if creator == "rps_parallel":
        creator = "pettingzoo.classic.rps_v2:parallel_env"
    done = run_cli("sample", "--env", creator, *SMALL, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "default_policy" in done.stdout and "player_0, player_1" in done.stdout


def test_one_policy_per_distinct_pair_of_spaces(workdir) -> None:
    done = run_cli("sample", "--env", "my_envs:mixed", *SMALL, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "policy_0" in done.stdout and "scout_0, scout_1" in done.stdout
    line = next(x for x in done.stdout.splitlines() if "policy_1" in x)
    assert line.split()[-1] == "base"


def test_image_env_without_a_preset_gets_a_hint(workdir) -> None:
    done = run_cli("sample", "--env", "my_envs:pixels", "--policy", "random", *SMALL, cwd=workdir)
    assert done.returncode == 0, done.stderr
    hint = [x for x in done.stderr.splitlines() if "hint" in x]
    assert len(hint) == 1 and "images (48, 48, 3)" in hint[0] and "--preset atari" in hint[0]


def test_runtime_failure_is_one_line_exit_1_unless_traceback(workdir) -> None:
    (workdir / "broken.py").write_text(
        "import gymnasium as gym\n"
        "class B(gym.Wrapper):\n"
        "    def step(self, a):\n"
        "        raise RuntimeError('simulated failure in the env')\n"
        "def env():\n"
        "    return B(gym.make('CartPole-v1'))\n"
    )
    done = run_cli("sample", "--env", "broken:env", *SMALL, cwd=workdir)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "simulated failure" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_cli("sample", "--env", "broken:env", *SMALL, "--traceback", cwd=workdir)
    assert done.returncode == 1 and "Traceback" in done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--env", "NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
        (["--num-envs", "0"], "--num-envs: 0 is not >= 1"),
        (["--plot", "returns.jpg"], "one of .png, .svg, .pdf"),
        (["--plot", "afile/returns.png"], "does not exist"),
        (["--out", "afile/sub"], "cannot create the folder"),
        (["--out", "afile"], "is a file, not a folder"),
        (["--out", "full"], "is not empty"),
        (["--out", "new", "--plot", "nodir/r.svg"], "does not exist"),
    ],
)
def test_usage_errors_exit_2_before_sampling(tmp_path, args, expected) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    done = run_cli("sample", *args, "--steps", "100", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and expected in done.stderr
    assert done.stdout == ""  # nothing sampled
    assert not (tmp_path / "new").exists()  # no output was created either


def test_corrupted_checkpoint_is_one_line(tmp_path) -> None:
    out = tmp_path / "run"
    assert run_cli("sample", *SMALL, "--out", str(out)).returncode == 0
    weights = next(out.rglob("weights*"))
    weights.write_bytes(weights.read_bytes()[:50])
    done = run_cli("inspect", str(out / "checkpoint"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "damaged checkpoint" in done.stderr


def test_a_closed_pipe_ends_quietly(tmp_path) -> None:
    """``rlconnect sample | head -1``: no BrokenPipeError message when the reader leaves."""
    import subprocess
    import sys

    from tests.cli.conftest import user_env

    proc = subprocess.Popen(
        [sys.executable, "-m", "rlconnect", "sample", *SMALL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=user_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the summary is printed
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=scaled(120)) == 1
    assert "Error" not in stderr and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("creator", ["my_envs:no_env", "os:getcwd"])
def test_a_creator_that_returns_no_env_is_a_usage_error(workdir, creator) -> None:
    done = run_cli("sample", "--env", creator, *SMALL, cwd=workdir)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and f"--env {creator!r}" in done.stderr
    assert "which is not an env" in done.stderr and done.stdout == ""


WITHOUT_EXTRAS = """
import sys
for name in ("pettingzoo", "envpool"):  # as if these extras were not installed
    sys.modules[name] = None
from rlconnect.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("env", "extra"),
    [("pettingzoo.classic.rps_v2:env", "pettingzoo"), ("envpool:Pong-v5", "envpool")],
)
def test_a_missing_extra_is_named_with_its_pip_command(tmp_path, env, extra) -> None:
    import subprocess
    import sys

    from tests.cli.conftest import user_env

    cmd = [sys.executable, "-c", WITHOUT_EXTRAS, "sample", "--env", env, *SMALL]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=scaled(120), env=user_env(), cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr  # like --plot without matplotlib: usage
    assert (
        done.stderr.count("\n") == 1 and done.stderr.count(f"pip install 'rlconnect[{extra}]'") == 1
    )


def test_help_is_wrapped_to_the_terminal() -> None:
    for args in ([], ["sample"], ["inspect"]):
        done = run_cli(*args, "--help")
        assert done.returncode == 0
        lines = done.stdout.splitlines()
        assert all(len(x) <= 80 for x in lines), max(lines, key=len)
    assert "exit codes: 0 done" in run_cli("--help").stdout
