"""What a run reports, as a user sees it (subprocesses): each agent's returns in the summary,
``run.json`` and ``inspect`` of a zero-sum game; ``inspect`` listing only settings that
differ from the defaults; a returns plot over env steps; labelled summary rows."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

from tests.cli.conftest import run_cli

HERE = Path(__file__).resolve().parent


def _rows(stdout: str) -> dict[str, str]:
    """Summary rows as ``label -> value`` (labels and values are apart by 2+ spaces)."""
    out = {}
    for line in stdout.splitlines()[1:]:
        label, _, value = line.strip().partition("  ")
        out[label] = value.strip()
    return out


def _episode_xs(svg: str) -> list[float]:
    """x of every episode marker: the marker drawn most often (ticks have their own)."""
    uses = re.findall(r'<use xlink:href="(#[^"]+)" x="([-\d.]+)"', svg)
    data = Counter(ref for ref, _ in uses).most_common(1)[0][0]
    return [float(x) for ref, x in uses if ref == data]


def test_a_zero_sum_game_reports_each_agent(tmp_path: Path) -> None:
    shutil.copy(HERE / "user_envs.py", tmp_path / "my_envs.py")
    args = ["--env", "my_envs:duel", "--num-envs", "2", "--steps", "400", "--quiet"]
    done = run_cli("sample", *args, "--out", "run", "--plot", "returns.svg", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = _rows(done.stdout)
    assert rows["mean return (all 100 episodes)"] == "0.00"  # the sum over agents
    assert rows["agent winner"] == "mean 4.00  min / max 4.00 / 4.00"
    assert rows["agent loser"] == "mean -4.00  min / max -4.00 / -4.00"
    assert "mean return (last 100)" not in rows  # 100 episodes: the mean over all says it
    assert "note" not in rows and rows["checkpoint"] == "run/checkpoint"
    assert rows["returns plot"] == "returns.svg (svg)"

    summary = json.loads((tmp_path / "run" / "run.json").read_text())["summary"]
    assert summary["mean_return_by_agent"] == {"winner": 4.0, "loser": -4.0}
    assert "mean_return_by_policy" not in summary  # both agents share default_policy

    shown = run_cli("inspect", "run", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "mean_return_by_agent:\n      winner: 4\n      loser: -4" in shown.stdout
    settings = shown.stdout.split("  settings:\n")[1].split("  summary:\n")[0]
    keys = [line.split(":")[0].strip() for line in settings.splitlines()]
    # only what this run set: its own keys and the non-default RunnerConfig values
    assert keys == ["env", "steps", "policy", "num_envs", "seed", "offline", "output"]

    # one batch of 100 episodes, each at the env step it ended: pairs of sub-envs end
    # together every 4 steps, so 50 x values (51 with the legend's marker), not one
    xs = _episode_xs((tmp_path / "returns.svg").read_text())
    assert len(xs) in (100, 101) and len(set(xs)) in (50, 51)
