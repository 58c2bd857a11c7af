"""Runner checkpoints: round trips across processes, restore, rebuild, fit errors, atomicity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv

import rlconnect as rc
from rlconnect.checkpoints import CheckpointMismatchError
from rlconnect.runner.inference import eval_mode

HERE = os.path.dirname(os.path.abspath(__file__))
CARTPOLE = gym.make("CartPole-v1")
OBS = np.random.default_rng(7).normal(0.0, 0.5, size=(16, 4)).astype(np.float32)


def cartpole_runner(seed: int = 3, hiddens=(16, 16), env="CartPole-v1", **cfg) -> rc.EnvRunner:
    config = rc.RunnerConfig(
        num_envs=2,
        rollout_fragment_length=32,
        seed=seed,
        observation_filter="MeanStdFilter",
        **cfg,
    )
    policy = rc.MLPPolicy(
        CARTPOLE.observation_space, CARTPOLE.action_space, hiddens=hiddens, seed=seed
    )
    return rc.EnvRunner(env, policy, config=config)


def outputs(runner: rc.EnvRunner) -> dict[str, np.ndarray]:
    """What a restored runner must reproduce: actions, filter outputs, dist inputs, stats."""
    actions = np.array([runner.compute_single_action(o) for o in OBS])
    pipe = runner.agent_pipeline()
    with eval_mode(pipe):
        data = rc.AgentData(
            np.full(len(OBS), -7),
            [f"probe{i}" for i in range(len(OBS))],
            {"obs": OBS, "rewards": np.zeros(len(OBS))},
        )
        filtered = pipe(data)["obs"]
    pipe.reset(-7)
    _, _, extra = runner.policies[rc.DEFAULT_POLICY_ID].compute_actions(
        {"obs": filtered}, explore=False
    )
    stats = pipe.get_statistics()["MeanStdFilter"]
    return {
        "actions": actions,
        "filtered": np.asarray(filtered),
        "dist_inputs": extra["action_dist_inputs"],
        "mean": np.asarray(stats["mean"]),
        "m2": np.asarray(stats["m2"]),
        "count": np.asarray(stats["count"]),
    }


def save_in_this_process(path: str, out: str) -> None:
    """Run in a subprocess: sample, save a checkpoint and the outputs to reproduce."""
    runner = cartpole_runner()
    for _ in range(4):
        runner.sample()
    runner.save_checkpoint(path)
    np.savez(out, **outputs(runner))


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.fixture(scope="module")
def saved_elsewhere(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("xproc")
    path, out = str(root / "ckpt"), str(root / "expected.npz")
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import test_checkpoint as t; "
        f"t.save_in_this_process({path!r}, {out!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=240)
    with np.load(out, allow_pickle=False) as f:
        expected = {k: f[k] for k in f.files}
    return path, expected


def test_checkpoint_from_another_process_rebuilds_the_same_runner(saved_elsewhere):
    path, expected = saved_elsewhere
    runner = rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")
    assert runner.config.observation_filter == "MeanStdFilter"
    assert runner.config.num_envs == 2
    assert_same(outputs(runner), expected)
    assert len(runner.sample()) == 64  # and it samples


def test_checkpoint_from_another_process_restores_into_a_fresh_runner(saved_elsewhere):
    path, expected = saved_elsewhere
    fresh = cartpole_runner(seed=99)
    before = outputs(fresh)
    assert not np.array_equal(before["dist_inputs"], expected["dist_inputs"])  # control
    fresh.restore(path)
    assert_same(outputs(fresh), expected)
    assert fresh.agent_pipeline().is_training  # the runner's mode is kept


def test_restore_reproduces_outputs_before_and_after(tmp_path):
    runner = cartpole_runner()
    runner.sample()
    runner.save_checkpoint(tmp_path / "ck")
    saved = outputs(runner)
    for _ in range(3):  # training moves the filter on
        runner.sample()
    assert not np.array_equal(outputs(runner)["mean"], saved["mean"])
    runner.restore(tmp_path / "ck")
    assert_same(outputs(runner), saved)


def test_manifest_is_readable_json_with_a_digest_per_file(tmp_path):
    runner = cartpole_runner()
    runner.save_checkpoint(tmp_path / "ck")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert manifest["format"] == "rlconnect.runner_checkpoint"
    assert manifest["format_version"] == 1
    assert manifest["rlconnect_version"] == rc.__version__
    assert manifest["config"]["observation_filter"] == "MeanStdFilter"
    (entry,) = manifest["policies"]
    assert entry["id"] == "default_policy"
    assert entry["spec"]["kind"] == "MLPPolicy"
    assert entry["spec"]["kwargs"]["hiddens"] == [16, 16]
    assert entry["spec"]["observation_space"]["type"] == "Box"
    assert sorted(entry["files"]) == [
        "action_pipeline",
        "agent_pipeline",
        "learner_pipeline",
        "weights",
    ]
    assert entry["weights_seq"] == 0
    for f in entry["files"].values():
        assert (tmp_path / "ck" / f["path"]).stat().st_size == f["size"]
        assert len(f["sha256"]) == 64
    assert rc.load_pipeline(
        str(tmp_path / "ck" / entry["files"]["agent_pipeline"]["path"]),
        runner.agent_pipeline().ctx,
    ).names == ["MeanStdFilter"]


def test_callables_in_the_config_are_left_out(tmp_path):
    runner = cartpole_runner(env=lambda ctx: gym.make("CartPole-v1"), env_config={"fn": len})
    runner.save_checkpoint(tmp_path / "ck")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert "env_config" in manifest["config_omitted"]
    rebuilt = rc.EnvRunner.from_checkpoint(tmp_path / "ck", env="CartPole-v1")
    assert rebuilt.config.env_config == {}


def test_config_overrides_apply_over_the_saved_config(tmp_path):
    cartpole_runner().save_checkpoint(tmp_path / "ck")
    runner = rc.EnvRunner.from_checkpoint(
        tmp_path / "ck", env="CartPole-v1", config_overrides={"num_envs": 3, "explore": False}
    )
    assert runner.num_envs == 3
    assert not runner.agent_pipeline().is_training
    with pytest.raises(ValueError, match="num_envs"):
        rc.EnvRunner.from_checkpoint(
            tmp_path / "ck", env="CartPole-v1", config_overrides={"num_envs": 0}
        )


def test_policy_ids_that_are_not_folder_names_round_trip(tmp_path):
    env = gym.make("CartPole-v1")
    pids = ["../evil", "a/b c"]
    policies = {
        p: rc.MLPPolicy(env.observation_space, env.action_space, hiddens=(8,), seed=i)
        for i, p in enumerate(pids)
    }
    runner = rc.EnvRunner(
        "CartPole-v1", policies, policy_mapping_fn=lambda agent, episode, **kw: "a/b c"
    )
    runner.sample()
    runner.save_checkpoint(tmp_path / "ck")
    folders = sorted(os.listdir(tmp_path / "ck" / "policies"))
    assert folders == ["_policy_0", "_policy_1"]
    rebuilt = rc.EnvRunner.from_checkpoint(
        tmp_path / "ck", env="CartPole-v1", policy_mapping_fn=lambda a, e, **kw: "a/b c"
    )
    for p in pids:
        w0, w1 = runner.policies[p].get_weights(), rebuilt.policies[p].get_weights()
        for k in w0:
            np.testing.assert_array_equal(w0[k], w1[k])


class UnregisteredPolicy(rc.RandomPolicy):
    pass


class RegisteredLaterPolicy(rc.RandomPolicy):
    pass


def test_from_checkpoint_needs_registered_policy_kinds(tmp_path):
    env = CounterEnv()
    for cls in (UnregisteredPolicy, RegisteredLaterPolicy):
        runner = rc.EnvRunner(
            lambda ctx: CounterEnv(), cls(env.observation_space, env.action_space)
        )
        runner.save_checkpoint(tmp_path / cls.__name__)
        with pytest.raises(rc.CheckpointError, match=r"registered kinds: \[.*'MLPPolicy'"):
            rc.EnvRunner.from_checkpoint(tmp_path / cls.__name__, env=lambda ctx: CounterEnv())
        runner.restore(tmp_path / cls.__name__)  # restoring into a built runner still works
    rc.register_policy("test_checkpoint.RegisteredLaterPolicy", RegisteredLaterPolicy)
    path = tmp_path / "RegisteredLaterPolicy"
    with pytest.raises(rc.CheckpointError, match="unregistered class"):  # saved before
        rc.EnvRunner.from_checkpoint(path, env=lambda ctx: CounterEnv())
    runner = rc.EnvRunner(
        lambda ctx: CounterEnv(), RegisteredLaterPolicy(env.observation_space, env.action_space)
    )
    runner.save_checkpoint(path)
    rebuilt = rc.EnvRunner.from_checkpoint(path, env=lambda ctx: CounterEnv())
    assert type(rebuilt.policies["default_policy"]) is RegisteredLaterPolicy


# -- a checkpoint that does not fit the runner -----------------------------------------------


def test_restore_names_unknown_and_missing_policy_ids(tmp_path):
    cartpole_runner().save_checkpoint(tmp_path / "ck")
    policy = rc.MLPPolicy(CARTPOLE.observation_space, CARTPOLE.action_space, hiddens=(16, 16))
    other = rc.EnvRunner("CartPole-v1", {"other": policy})
    with pytest.raises(CheckpointMismatchError, match=r"'default_policy'.*'other'"):
        other.restore(tmp_path / "ck")
    assert issubclass(CheckpointMismatchError, rc.CheckpointError)
    assert issubclass(CheckpointMismatchError, ValueError)


def test_restore_names_different_spaces(tmp_path):
    def runner(n_actions):
        env = CounterEnv(n_actions=n_actions)
        policy = rc.MLPPolicy(env.observation_space, env.action_space, hiddens=(8,))
        return rc.EnvRunner(lambda ctx: CounterEnv(n_actions=n_actions), policy)

    runner(3).save_checkpoint(tmp_path / "ck")
    with pytest.raises(
        CheckpointMismatchError,
        match=r"'default_policy': action space differs: checkpoint Discrete\(3\).*Discrete\(2\)",
    ):
        runner(2).restore(tmp_path / "ck")
    acrobot = gym.make("Acrobot-v1")
    policy = rc.MLPPolicy(acrobot.observation_space, acrobot.action_space, hiddens=(8,))
    with pytest.raises(CheckpointMismatchError, match="observation space differs"):
        rc.EnvRunner("Acrobot-v1", policy).restore(tmp_path / "ck")
    with pytest.raises(CheckpointMismatchError, match="env observation space differs"):
        rc.EnvRunner.from_checkpoint(tmp_path / "ck", env="CartPole-v1")


def test_restore_names_a_different_architecture_and_changes_nothing(tmp_path):
    cartpole_runner(hiddens=(16, 16)).save_checkpoint(tmp_path / "ck")
    small = cartpole_runner(hiddens=(8,))
    weights = small.get_weights()
    pipe = small.agent_pipeline()
    with pytest.raises(
        CheckpointMismatchError,
        match=r"'default_policy': different architecture .*only in the checkpoint: "
        r"\['pi.4.bias'.*shapes differ: .*'pi.0.bias': checkpoint \(16,\), runner \(8,\)",
    ):
        small.restore(tmp_path / "ck")
    after = small.get_weights()["default_policy"]
    for k, v in weights["default_policy"].items():
        np.testing.assert_array_equal(after[k], v)
    assert small.agent_pipeline() is pipe


# -- atomic writes -----------------------------------------------------------------------------


def test_saving_over_a_checkpoint_replaces_it_and_leaves_no_temp_folders(tmp_path):
    runner = cartpole_runner()
    runner.save_checkpoint(tmp_path / "ck")
    runner.sample()
    runner.save_checkpoint(tmp_path / "ck")
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    fresh = cartpole_runner(seed=5)
    fresh.restore(tmp_path / "ck")
    assert_same(outputs(fresh), outputs(runner))


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import rlconnect.checkpoints.runner_save as ckpt

    runner = cartpole_runner()
    runner.save_checkpoint(tmp_path / "ck")
    before = {p: p.read_bytes() for p in (tmp_path / "ck").rglob("*") if p.is_file()}
    runner.sample()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "save_pipeline", crash)
    with pytest.raises(KeyboardInterrupt):
        runner.save_checkpoint(tmp_path / "ck")
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    after = {p: p.read_bytes() for p in (tmp_path / "ck").rglob("*") if p.is_file()}
    assert after == before
    monkeypatch.undo()
    cartpole_runner().restore(tmp_path / "ck")


def test_saving_never_replaces_something_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    (tmp_path / "file").write_text("keep me too")
    runner = cartpole_runner()
    for target in ("data", "file"):
        with pytest.raises(FileExistsError, match="refusing to replace"):
            runner.save_checkpoint(tmp_path / target)
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me"
    assert (tmp_path / "file").read_text() == "keep me too"
    (tmp_path / "empty").mkdir()
    runner.save_checkpoint(tmp_path / "empty")
    assert (tmp_path / "empty" / "manifest.json").is_file()
    runner.save_checkpoint(Path(tmp_path / "new" / "nested" / "ck"))
    assert (tmp_path / "new" / "nested" / "ck" / "manifest.json").is_file()
