"""Two policies on a small multi-agent env: agents that join late and act in turns.

The env, ``Relay``, is defined below. Each episode lasts 12 env steps:

- ``scout`` is there from the start and acts on even steps. It sees a 2-d position
  (``Box``) and picks one of 3 directions; it is rewarded for pointing at a hidden target.
- ``worker_0`` joins at step 1 and ``worker_1`` at step 5; joined workers act together on
  odd steps. They see the current stage of the relay (``Discrete(4)``) and pick a bit;
  they are rewarded when it matches the stage's parity. At the end every agent that joined
  gets a team bonus, given while it is not acting (the runner adds it to its last row).

Two policies, picked by ``policy_mapping_fn``: ``scout_policy`` for the scout and one
``worker_policy`` shared by both workers. Each policy gets its own agent pipeline: the
workers' ``Discrete(4)`` observations are one-hot encoded by ``FlattenObservations`` (the
default chain adds it for non-Box spaces), so ``worker_policy`` is built for the pipeline's
output space, ``Box(0, 1, (4,))``.

``runner.sample()`` returns a ``MultiAgentBatch``: one ``SampleBatch`` per policy, with
``env_steps()`` (env steps, the batch size in ``count_steps_by="env_steps"`` mode) and
``agent_steps()`` (rows over all policies). ``get_metrics()`` reports per-episode rewards
keyed by ``(agent_id, policy_id)``.

Run::

    python examples/multi_agent.py            # 4 sub-envs, 10 batches
    python examples/multi_agent.py --smoke    # 2 sub-envs, 1 batch
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlconnect as rc

EPISODE_LENGTH = 12
JOIN_STEP = {"worker_0": 1, "worker_1": 5}


class Relay(rc.MultiAgentEnv):
    """A scout acting on even steps; workers that join late and act on odd steps."""

    possible_agents = ["scout", "worker_0", "worker_1"]

    def __init__(self, env_context: Any = None) -> None:
        self.observation_spaces = {
            "scout": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "worker_0": gym.spaces.Discrete(4),
            "worker_1": gym.spaces.Discrete(4),
        }
        self.action_spaces = {
            "scout": gym.spaces.Discrete(3),
            "worker_0": gym.spaces.Discrete(2),
            "worker_1": gym.spaces.Discrete(2),
        }
        self.rng = np.random.default_rng()

    def _observe(self) -> dict[str, Any]:
        """Observations of the agents that act next."""
        if self.t % 2 == 0:
            return {"scout": self.rng.uniform(-1, 1, 2).astype(np.float32)}
        stage = np.int64((self.t // 3) % 4)
        return {a: stage for a, start in JOIN_STEP.items() if self.t >= start}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.target = int(self.rng.integers(3))
        self.obs = self._observe()
        return self.obs, {}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        rewards: dict[str, float] = {}
        for agent, action in actions.items():
            if agent == "scout":
                rewards[agent] = 1.0 if int(action) == self.target else 0.0
            else:
                rewards[agent] = 1.0 if int(action) == int(self.obs[agent]) % 2 else -0.5
        self.t += 1
        done = self.t >= EPISODE_LENGTH
        if done:  # a team bonus, also for agents that do not act in this step
            for agent in ["scout", *JOIN_STEP]:
                rewards[agent] = rewards.get(agent, 0.0) + 2.0
            self.obs = {}
        else:
            self.obs = self._observe()
        return self.obs, rewards, {"__all__": done}, {"__all__": False}, {}


def policy_mapping_fn(agent_id: str, episode: rc.Episode, **kwargs: Any) -> str:
    """The scout has its own policy; both workers share one."""
    return "scout_policy" if agent_id == "scout" else "worker_policy"


def build_runner(num_envs: int, seed: int) -> rc.EnvRunner:
    env = Relay()
    # The policy must be built for what its agent pipeline outputs: for the workers that is
    # the one-hot encoding of Discrete(4) (see the default chain).
    worker_ctx = rc.ConnectorContext(
        env.observation_spaces["worker_0"], env.action_spaces["worker_0"]
    )
    worker_obs_space = rc.default_agent_pipeline(worker_ctx).output_space
    policies = {
        "scout_policy": rc.MLPPolicy(
            env.observation_spaces["scout"], env.action_spaces["scout"], seed=seed
        ),
        "worker_policy": rc.MLPPolicy(
            worker_obs_space, env.action_spaces["worker_0"], hiddens=(16,), seed=seed + 1
        ),
    }
    config = rc.RunnerConfig(
        num_envs=num_envs,
        rollout_fragment_length=EPISODE_LENGTH,
        batch_mode="complete_episodes",
        seed=seed,
    )
    return rc.EnvRunner(Relay, policies, policy_mapping_fn=policy_mapping_fn, config=config)


def check_trajectories(batch: rc.SampleBatch) -> None:
    """Each agent's rows are contiguous and chain: new_obs[t] == obs[t + 1]."""
    keys = list(zip(batch["eps_id"].tolist(), batch["agent_index"].tolist()))
    starts = [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]]
    assert len(starts) == len(set(keys)), "an agent trajectory is not contiguous"
    for a, b in zip(starts, [*starts[1:], len(keys)]):
        np.testing.assert_array_equal(batch["new_obs"][a : b - 1], batch["obs"][a + 1 : b])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one small batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    num_envs, num_batches = (2, 1) if args.smoke else (4, 10)

    with build_runner(num_envs, args.seed) as runner:
        for pid in runner.policies:
            print(f"{pid}: agent pipeline {runner.agent_pipeline(pid)}")
        batches = []
        for _ in range(num_batches):
            batch = runner.sample()
            assert isinstance(batch, rc.MultiAgentBatch)  # two policies
            batches.append(batch)
        metrics = runner.get_metrics()

    ma_batch = rc.concat_samples(batches)
    print(ma_batch)
    print(f"env_steps {ma_batch.env_steps()}  agent_steps {ma_batch.agent_steps()}")
    assert sorted(ma_batch.policy_batches) == ["scout_policy", "worker_policy"]
    assert ma_batch.agent_steps() == sum(len(b) for b in ma_batch.policy_batches.values())

    for pid, batch in sorted(ma_batch.policy_batches.items()):
        check_trajectories(batch)
        print(
            f"{pid}: {len(batch)} rows, obs {batch['obs'].shape[1:]} {batch['obs'].dtype}, "
            f"agent_index values {sorted(set(batch['agent_index'].tolist()))}"
        )
        # `t` is the env step at which each row's obs was seen: it jumps for turn-takers.
        in_first = batch["eps_id"] == batch["eps_id"][0]
        for index in sorted(set(batch["agent_index"][in_first].tolist())):
            rows = in_first & (batch["agent_index"] == index)
            print(f"  first episode, agent_index {index}: t = {batch['t'][rows].tolist()}")
    workers = ma_batch.policy_batches["worker_policy"]
    assert workers["obs"].shape[1:] == (4,) and np.all(workers["obs"].sum(axis=1) == 1)

    by_key: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for record in metrics:
        for key, reward in record["agent_rewards"].items():
            by_key[key].append(reward)
    print(f"{len(metrics)} episodes; mean reward per (agent, policy):")
    for (agent, pid), rewards in sorted(by_key.items()):
        print(f"  ({agent}, {pid}): {np.mean(rewards):6.2f} over {len(rewards)} episodes")
    assert set(by_key) == {
        ("scout", "scout_policy"),
        ("worker_0", "worker_policy"),
        ("worker_1", "worker_policy"),
    }
    print("OK: per-policy batches chain per agent; metrics keyed by (agent, policy)")


if __name__ == "__main__":
    main()
