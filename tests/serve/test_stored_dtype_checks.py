"""Observations are checked in the dtype the runner stores (issue 55, item 1): 1e300 sent
as float64 for a float32 space would become inf there and stop sampling for everyone."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from server_probes import raw_post, sample_forever

import rlconnect as rc
from rlconnect.envs import BadObservationError
from rlconnect.envs.external import check_obs
from rlconnect.serve import PolicyClient, PolicyServer

UNBOUNDED = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
DICT = gym.spaces.Dict({"pos": UNBOUNDED, "n": gym.spaces.Discrete(3)})
ACT = gym.spaces.Discrete(2)
FLAT = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)  # the flattened DICT
HUGE = np.array([1e300, 0.0, 0.0])  # float64, finite; inf as float32


def test_the_check_casts_first_box_dict_and_integer_boxes():
    with pytest.raises(BadObservationError, match="beyond what float32 holds"):
        check_obs(UNBOUNDED, HUGE, "episode 'e'")
    with pytest.raises(BadObservationError, match=r"field 'pos'.*beyond what float32"):
        check_obs(DICT, {"pos": HUGE, "n": 1}, "episode 'e'")
    half = gym.spaces.Box(-np.inf, np.inf, (1,), np.float16)
    with pytest.raises(BadObservationError, match="beyond what float16 holds"):
        check_obs(half, np.array([1e5], np.float32), "e")
    got = check_obs(DICT, {"pos": np.array([1e30, 0, 0]), "n": 2}, "e")
    assert got["pos"].dtype == np.float32 and np.isfinite(got["pos"]).all()


@pytest.mark.parametrize("space", [UNBOUNDED, DICT], ids=["box", "dict"])
def test_one_request_of_1e300_cannot_stop_a_training_server(space):
    policy = rc.RandomPolicy(UNBOUNDED if space is UNBOUNDED else FLAT, ACT, seed=0)
    server = PolicyServer(policy, "127.0.0.1", 0, observation_space=space)
    errors: list[BaseException] = []
    batches: list = []
    sampler = sample_forever(server, batches, errors)
    good = space.sample()
    bad = HUGE if space is UNBOUNDED else {"pos": HUGE, "n": 1}
    try:
        client = PolicyClient(server.url, retry_timeout_s=10)
        eid = client.start_episode()
        for call in ("get_action", "log_action"):
            args = (eid, bad) if call == "get_action" else (eid, bad, 0)
            with pytest.raises(BadObservationError, match="beyond what float32 holds"):
                getattr(client, call)(*args)
        # every later call is served: the runner never saw the value
        for _ in range(20):
            assert ACT.contains(int(client.get_action(eid, good)))
        client.end_episode(eid, good)
        status, out = raw_post(server.port, "start_episode", {})
        assert status == 200, out
        assert not errors and server.runner.failure is None
        client.close()
    finally:
        server.stop()
        sampler.join(10)


def test_deployed_policy_and_runner_inference_refuse_it(tmp_path):
    runner = rc.EnvRunner(rc.serve.ServingEnv(ACT, DICT, 1), rc.RandomPolicy(FLAT, ACT, seed=0))
    with pytest.raises(rc.EnvCheckError, match=r"obs\['pos'\].*beyond what float32"):
        runner.compute_single_action({"pos": HUGE, "n": 1})
    box_runner = rc.EnvRunner(
        rc.serve.ServingEnv(ACT, UNBOUNDED, 1), rc.MLPPolicy(UNBOUNDED, ACT, seed=0)
    )
    rc.export_policy(box_runner, tmp_path / "p.policy")
    deployed = rc.load_policy(tmp_path / "p.policy")
    with pytest.raises(rc.EnvCheckError, match="obs: values beyond what float32"):
        deployed.compute_action(HUGE, session="s")
    with pytest.raises(rc.EnvCheckError, match=r"obs\[1\]: values beyond"):
        deployed.compute_actions([np.zeros(3), HUGE], sessions=["a", "b"])
    assert ACT.contains(int(deployed.compute_action(np.array([1e30, 0, 0]), session="s")))
