"""Write, register, save and reload your own connector, in a fresh process.

What it shows:

1. ``RewardStdScale`` below is a user-written agent connector with *statistics*: it divides
   rewards by the running standard deviation of all rewards seen while training (a
   batched, mergeable mean/variance), and clips the result. It subclasses
   ``rc.AgentConnector`` and works on whole columns, is registered by name with
   ``@rc.register_connector``, passes its parameters to ``super().__init__`` (what gets
   saved), and exposes ``get_statistics`` / ``set_statistics`` (what gets restored).
   ``rc.check_pipeline`` checks it against the connector contract.
2. It goes into a pipeline (``MeanStdFilter -> RewardStdScale``) that an ``EnvRunner`` uses
   on Pendulum-v1 in place of the default chain; sampling fills both statistics.
3. ``rc.save_pipeline`` writes the pipeline (no pickle: JSON structure plus arrays).
4. A fresh Python process imports this module (which registers the connector), loads the
   file with ``rc.load_pipeline`` and runs the same probe rows in eval mode: its outputs
   are bit-for-bit identical to this process's.
5. A fresh process that does *not* import the registration cannot rebuild the connector:
   loading raises ``rc.UnknownConnectorError`` naming it (a file never runs code, so the
   class must come from an import you chose).

Run::

    python examples/custom_connector.py            # 10 batches of 4 x 200 Pendulum steps
    python examples/custom_connector.py --smoke    # 1 batch of 4 x 50 steps
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

import rlconnect as rc

ENV_ID = "Pendulum-v1"
HERE = os.path.dirname(os.path.abspath(__file__))


@rc.register_connector("RewardStdScale")
class RewardStdScale(rc.AgentConnector):
    """Divides rewards by the running std of the rewards seen in training, then clips.

    Statistics: ``count``, ``mean`` and ``m2`` (sum of squared deviations), updated per
    batch with Chan's parallel formula, only while ``self.is_training``. Rows at ``t == 0``
    (an observation right after a reset, which the runner passes with reward 0) are scaled
    but not counted.

    Args:
        ctx: the connector context.
        clip: outputs are clipped to ``[-clip, clip]``.
        epsilon: added to the variance before the square root.
    """

    def __init__(self, ctx: rc.ConnectorContext, clip: float = 10.0, epsilon: float = 1e-8):
        if clip <= 0:
            raise ValueError(f"RewardStdScale: clip must be > 0, got {clip!r}")
        super().__init__(ctx, clip=float(clip), epsilon=float(epsilon))  # the saved params
        self.clip, self.epsilon = float(clip), float(epsilon)
        self.count, self.mean, self.m2 = 0.0, 0.0, 0.0

    def __call__(self, data: rc.AgentData) -> rc.AgentData:
        """The whole batch at once: no Python loop over rows."""
        if "rewards" not in data:
            return data
        r = np.asarray(data["rewards"], np.float64)
        if self.is_training:
            seen = r[np.asarray(data["t"]) > 0] if "t" in data else r
            if seen.size:
                n, batch_mean = float(seen.size), float(seen.mean())
                batch_m2 = float(np.square(seen - batch_mean).sum())
                delta, total = batch_mean - self.mean, self.count + n
                self.m2 += batch_m2 + delta * delta * self.count * n / total
                self.mean += delta * n / total
                self.count = total
        var = self.m2 / self.count if self.count > 1 else 1.0
        scaled = np.clip(r / np.sqrt(var + self.epsilon), -self.clip, self.clip)
        data["rewards"] = scaled.astype(np.float32)
        return data

    def get_statistics(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def set_statistics(self, stats: Mapping[str, Any]) -> None:
        self.count, self.mean, self.m2 = (float(stats[k]) for k in ("count", "mean", "m2"))


def make_context() -> rc.ConnectorContext:
    """The context both processes build the pipeline for (Pendulum's spaces)."""
    env = gym.make(ENV_ID)
    return rc.ConnectorContext(env.observation_space, env.action_space)


def make_pipeline(ctx: rc.ConnectorContext) -> rc.AgentConnectorPipeline:
    """The agent pipeline the runner uses instead of the default chain."""
    return rc.AgentConnectorPipeline(ctx, [rc.MeanStdFilter(ctx), RewardStdScale(ctx, clip=5.0)])


def probe_rows(n: int = 16) -> rc.AgentData:
    """Fixed rows (obs, rewards) to compare outputs across processes."""
    rng = np.random.default_rng(123)
    obs = rng.uniform([-1, -1, -8], [1, 1, 8], size=(n, 3)).astype(np.float32)
    rewards = rng.uniform(-16.3, 0.0, size=n).astype(np.float32)
    return rc.AgentData(np.arange(n) % 4, ["agent0"] * n, {"obs": obs, "rewards": rewards})


def run_probe(pipe: rc.AgentConnectorPipeline) -> dict[str, np.ndarray]:
    """Outputs of ``pipe`` on the probe rows, in eval mode (statistics frozen)."""
    pipe.in_eval()
    out = pipe(probe_rows())
    return {"obs": np.asarray(out["obs"]), "rewards": np.asarray(out["rewards"])}


# What the fresh processes run. The first imports this module: that registers the connector.
RELOAD_WITH_REGISTRATION = """
import sys
import numpy as np
import rlconnect as rc
sys.path.insert(0, {here!r})
import custom_connector  # registers RewardStdScale

pipe = rc.load_pipeline({path!r}, custom_connector.make_context())
print("reloaded:", pipe, pipe.get_statistics()["RewardStdScale"])
np.savez({out!r}, **custom_connector.run_probe(pipe))
"""

RELOAD_WITHOUT_REGISTRATION = """
import gymnasium as gym
import rlconnect as rc

env = gym.make("Pendulum-v1")
ctx = rc.ConnectorContext(env.observation_space, env.action_space)
try:
    rc.load_pipeline({path!r}, ctx)
except rc.UnknownConnectorError as err:
    print("UnknownConnectorError:", err)
else:
    raise SystemExit("loaded without the registration?")
"""


def fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter; return its stdout (raise if it failed)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"child process failed ({done.returncode}):\n{done.stderr}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one small batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    fragment, num_batches = (50, 1) if args.smoke else (200, 10)

    ctx = make_context()
    print(rc.check_pipeline(make_pipeline(ctx), probe_rows().get("obs")))

    env = gym.make(ENV_ID)
    runner = rc.EnvRunner(
        ENV_ID,
        rc.RandomPolicy(env.observation_space, env.action_space, seed=args.seed),
        config=rc.RunnerConfig(num_envs=4, rollout_fragment_length=fragment, seed=args.seed),
        agent_pipelines={rc.DEFAULT_POLICY_ID: make_pipeline},  # callable: ctx -> pipeline
    )
    with runner:
        for _ in range(num_batches):
            batch = runner.sample()
            assert isinstance(batch, rc.SampleBatch)
            scaled = batch["rewards"]  # what the policy (and a learner) sees
        pipe = runner.agent_pipeline()
    print(f"runner pipeline: {pipe}")
    stats = pipe.get_statistics()["RewardStdScale"]
    print(f"RewardStdScale statistics after {num_batches * 4 * fragment} steps: {stats}")
    print(f"last batch rewards (scaled): min {scaled.min():.3f} max {scaled.max():.3f}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "reward_scale.pipeline")
        rc.save_pipeline(pipe, path)
        print(f"saved to {os.path.basename(path)} ({os.path.getsize(path)} bytes)")
        here_outputs = run_probe(pipe)

        out = os.path.join(tmp, "child_outputs.npz")
        print(fresh_python(RELOAD_WITH_REGISTRATION.format(here=HERE, path=path, out=out)))
        with np.load(out, allow_pickle=False) as child:
            for column in ("obs", "rewards"):
                np.testing.assert_array_equal(child[column], here_outputs[column])
                assert child[column].dtype == here_outputs[column].dtype
        print("OK: a fresh process gives identical outputs after load_pipeline")

        message = fresh_python(RELOAD_WITHOUT_REGISTRATION.format(path=path))
        print(message)
        assert message.startswith("UnknownConnectorError") and "RewardStdScale" in message
        print("OK: without the registration, loading fails with UnknownConnectorError")


if __name__ == "__main__":
    main()
