"""OfflineConfig: offline's settings, held by RunnerConfig.offline, given either way."""

from __future__ import annotations

import json

import attrs
import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.runner.extensions import ConfigSection, register_config_section


def test_the_keywords_of_runner_config_become_its_offline_config() -> None:
    config = rc.RunnerConfig(output="out", input="data/*.parquet", shuffle_buffer_size=5)
    assert config.offline == rc.OfflineConfig(
        output="out", input="data/*.parquet", shuffle_buffer_size=5
    )
    assert isinstance(config.offline, ConfigSection)
    assert rc.RunnerConfig().offline is None  # no offline output nor input
    # given both ways: the keywords set those settings on (a copy of) the section given
    both = rc.RunnerConfig(offline=rc.OfflineConfig(output="a", input="b"), output="c")
    assert both.offline == rc.OfflineConfig(output="c", input="b")
    assert attrs.evolve(both, input="sampler").offline == rc.OfflineConfig(output="c")
    assert rc.RunnerConfig(offline={"output": "d"}).offline == rc.OfflineConfig(output="d")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"output": 3}, r"OfflineConfig.output=3: must be a path string or None"),
        ({"input": ""}, r"OfflineConfig.input='': allowed are 'sampler'"),
        ({"input": {"a": 0.5}}, r"sum to 1"),
        ({"output_max_file_size": 0}, r"output_max_file_size=0: must be an integer >= 1"),
        ({"shuffle_buffer_size": -1}, r"shuffle_buffer_size=-1: must be an integer >= 0"),
        ({"postprocess_inputs": 1}, r"postprocess_inputs=1: must be True or False"),
        ({"input": "x", "off_policy_estimation": ("dr",)}, r"unknown \['dr'\]"),
        ({"off_policy_estimation": ("is",)}, r"needs input= files"),
        ({"input": "x", "off_policy_gamma": 2}, r"off_policy_gamma=2: must be a number in"),
    ],
)
def test_bad_settings_name_the_setting_either_way(settings: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rc.OfflineConfig(**settings)
    with pytest.raises(ValueError, match=match):
        rc.RunnerConfig(**settings)


def test_unknown_keywords_and_sections_are_named() -> None:
    with pytest.raises(TypeError, match=r"unknown settings \['outptu'\]; allowed: .*output"):
        rc.RunnerConfig(outptu="x")
    with pytest.raises(ValueError, match=r"RunnerConfig.offline=3: must be an OfflineConfig"):
        rc.RunnerConfig(offline=3)
    with pytest.raises(ValueError, match=r"no config section 'seed'"):
        register_config_section("seed", rc.OfflineConfig)


def test_the_config_round_trips_through_its_dict() -> None:
    config = rc.RunnerConfig(seed=1, output="o", output_compress_columns=["obs"])
    saved = json.loads(json.dumps(config.to_dict()))
    assert saved["offline"]["output"] == "o" and "output" not in saved
    assert rc.RunnerConfig(**saved) == config
    assert rc.RunnerConfig(**rc.RunnerConfig().to_dict()) == rc.RunnerConfig()
    assert rc.OfflineConfig(output_compress_columns="obs").output_compress_columns == ("obs",)


def _checkpoint(tmp_path, **config):
    env = gym.make("CartPole-v1")
    policy = rc.RandomPolicy(env.observation_space, env.action_space, seed=0)
    cfg = rc.RunnerConfig(rollout_fragment_length=5, seed=0, **config)
    with rc.EnvRunner("CartPole-v1", policy, config=cfg) as runner:
        runner.sample()
        runner.save_checkpoint(str(tmp_path / "ck"))
    return tmp_path / "ck"


def test_checkpoints_with_flat_offline_keys_still_load(tmp_path) -> None:
    """A config saved before ``RunnerConfig.offline`` held offline's settings as its own
    keys; it loads into an OfflineConfig, its paths left out as always."""
    path = _checkpoint(tmp_path, output=str(tmp_path / "written"), shuffle_buffer_size=7)
    manifest = json.loads((path / "manifest.json").read_text())
    nested = manifest["config"].pop("offline")
    assert nested["output"] == str(tmp_path / "written")
    manifest["config"].update(nested)  # the old, flat form
    (path / "manifest.json").write_text(json.dumps(manifest))
    runner = rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")
    assert runner.config.offline == rc.OfflineConfig(shuffle_buffer_size=7)
    runner.stop()


def test_a_runner_without_offline_settings_has_no_sink_nor_source(tmp_path) -> None:
    env = gym.make("CartPole-v1")
    policy = rc.RandomPolicy(env.observation_space, env.action_space, seed=0)
    config = rc.RunnerConfig(rollout_fragment_length=5, offline=rc.OfflineConfig())
    with rc.EnvRunner("CartPole-v1", policy, config=config) as runner:
        assert len(runner.sample()) == 5
        assert runner._sinks == [] and runner._source is None
    config = rc.RunnerConfig(rollout_fragment_length=5, output=str(tmp_path / "o"))
    with rc.EnvRunner("CartPole-v1", policy, config=config) as runner:
        runner.sample()
        evaluated = runner.evaluate(1)
    assert len(evaluated) == 1
    assert len(list(rc.read_batches(str(tmp_path / "o")))) == 1  # evaluation writes nothing
