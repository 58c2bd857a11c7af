"""The Atari preset on real ale-py games: parity with gymnasium's own preprocessing (gray
screens from the emulator, or RGB + Grayscale), whole-game episodes across lives, and the
runner's output space, reward clipping and frame storage."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from tests.envs.env_cases import assert_same_batches

import rlconnect as rc
from rlconnect.connectors import AgentData
from rlconnect.envs.atari import FireReset, ScreenFrames, is_atari_id, make_atari_env

pytest.importorskip("ale_py")
pytest.importorskip("cv2")  # gymnasium's AtariPreprocessing needs OpenCV

STACKED = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
#: the stated tolerance against gymnasium's AtariPreprocessing + FrameStackObservation:
#: no pixel more than 1 gray level off, and at most 0.1% of pixels off at all (ALE's own
#: grayscale palette and OpenCV's fixed-point INTER_AREA round differently in rare cases)
MAX_LEVELS, MAX_FRACTION_OFF = 1, 1e-3
#: RGB frames resized env-side, then made gray: both steps round to uint8, so more pixels
#: are a level off (0.45 % on Pong)
MAX_FRACTION_OFF_RGB_RESIZED = 5e-3


def _reference(game: str) -> gym.Env:
    env = gym.make(game, frameskip=1)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False
    )
    return gym.wrappers.FrameStackObservation(FireReset(env), 4)


@pytest.mark.parametrize(
    ("grayscale", "screen_size", "first"),
    [
        (True, 84, "ClipReward"),
        (True, None, "Resize"),
        (False, 84, "Grayscale"),
        (False, None, "Grayscale"),
    ],
    ids=["ale-gray-resized", "ale-gray+Resize", "rgb-resized+Grayscale", "rgb+Grayscale+Resize"],
)
@pytest.mark.parametrize(("game", "steps"), [("ALE/Breakout-v5", 80), ("ALE/Pong-v5", 80)])
def test_preset_matches_gymnasium_atari_preprocessing(
    game: str, steps: int, grayscale: bool, screen_size: int | None, first: str
):
    ours = make_atari_env(game, grayscale=grayscale, screen_size=screen_size)
    ref = _reference(game)
    ctx = rc.ConnectorContext(ours.observation_space, ours.action_space, {"preset": "atari"})
    pipe = rc.default_agent_pipeline(ctx)
    assert pipe.names[0] == first  # what the env side did is not done again
    rng = np.random.default_rng(0)

    def stack(obs: np.ndarray, reward: float = 0.0) -> np.ndarray:
        data = AgentData([0], ["agent0"], {"obs": obs[None], "rewards": np.array([reward])})
        return pipe(data)["obs"][0]

    (o1, _), (o2, _) = ours.reset(seed=5), ref.reset(seed=5)
    diffs = [np.abs(stack(o1).astype(int) - o2)]
    for _ in range(steps):
        a = int(rng.integers(ours.action_space.n))
        o1, r1, t1, tr1, _ = ours.step(a)
        o2, r2, t2, tr2, _ = ref.step(a)
        assert (r1, t1, tr1) == (r2, t2, tr2)  # the same emulator frames
        diffs.append(np.abs(stack(o1, r1).astype(int) - o2))
        if t1 or tr1:
            break
    d = np.stack(diffs)
    assert d.max() <= MAX_LEVELS
    rounded_twice = not grayscale and screen_size is not None
    assert (d > 0).mean() <= (MAX_FRACTION_OFF_RGB_RESIZED if rounded_twice else MAX_FRACTION_OFF)


def test_a_bilinear_resize_is_visibly_not_gymnasiums():
    """Negative control for the tolerance above: the other interpolation exceeds it."""
    ours = make_atari_env("ALE/Pong-v5", screen_size=None)
    ref = _reference("ALE/Pong-v5")
    (o1, _), (o2, _) = ours.reset(seed=5), ref.reset(seed=5)
    for _ in range(20):
        o1, *_ = ours.step(2)
        o2, *_ = ref.step(2)
    ctx = rc.ConnectorContext(ours.observation_space, ours.action_space)
    bilinear = rc.AgentConnectorPipeline(ctx, [rc.connectors.Resize(ctx, 84, 84, "bilinear")])
    last = bilinear(AgentData([0], ["a"], {"obs": o1[None]}))["obs"][0]
    assert np.abs(last.astype(int) - o2[-1]).max() > MAX_LEVELS


@pytest.mark.parametrize("grayscale", [True, False])
def test_env_side_resize_gives_the_resize_connectors_pixels(grayscale: bool):
    """Frames resized env-side (the default) equal native frames resized by the ``Resize``
    connector, so the preset's rows do not depend on where the resize runs."""
    ours = make_atari_env("ALE/Breakout-v5", grayscale=grayscale)
    native = make_atari_env("ALE/Breakout-v5", grayscale=grayscale, screen_size=None)
    assert ours.observation_space.shape == ((84, 84) if grayscale else (84, 84, 3))
    ctx = rc.ConnectorContext(native.observation_space, native.action_space)
    resize = rc.AgentConnectorPipeline(ctx, [rc.connectors.Resize(ctx, 84, 84)])
    assert resize.output_space == ours.observation_space
    (o1, _), (o2, _) = ours.reset(seed=2), native.reset(seed=2)
    rng = np.random.default_rng(2)
    frames, natives = [o1], [o2]
    for _ in range(60):
        a = int(rng.integers(ours.action_space.n))
        frames.append(ours.step(a)[0])
        natives.append(native.step(a)[0])
    got = np.stack(frames)
    want = resize(AgentData(list(range(len(natives))), ["a"] * len(natives),
                            {"obs": np.stack(natives)}))["obs"]  # fmt: skip
    assert got.dtype == np.uint8 and not np.array_equal(got[0], got[-1])  # frames moved
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("grayscale", [True, False])
def test_screen_frames_equal_gymnasium_wrapper_over_a_whole_game(grayscale: bool):
    """``ScreenFrames`` over a base env that renders nothing (obs_type="ram") gives exactly
    ``AtariPreprocessing(screen_size=native)`` over the usual RGB base env, including the
    step that ends the game inside a frame skip."""
    ours = make_atari_env(
        "ALE/Breakout-v5", grayscale=grayscale, fire_reset=False, screen_size=None
    )
    base = gym.make("ALE/Breakout-v5", frameskip=1)
    ref = gym.wrappers.AtariPreprocessing(
        base, screen_size=(160, 210), grayscale_obs=grayscale, terminal_on_life_loss=False
    )
    assert ours.observation_space == ref.observation_space
    (o1, i1), (o2, i2) = ours.reset(seed=3), ref.reset(seed=3)
    np.testing.assert_array_equal(o1, o2)
    rng = np.random.default_rng(1)
    for _ in range(2000):
        a = int(rng.integers(ours.action_space.n))
        o1, r1, t1, tr1, i1 = ours.step(a)
        o2, r2, t2, tr2, i2 = ref.step(a)
        np.testing.assert_array_equal(o1, o2)
        assert (r1, t1, tr1, i1["lives"]) == (r2, t2, tr2, i2["lives"])
        if t1 or tr1:
            break
    assert t1  # a whole game was compared
    assert not np.shares_memory(o1, ours.obs_buffer[0])  # a fresh array, not the buffer


def test_runner_preset_on_breakout_counts_whole_games():
    policy = rc.RandomPolicy(STACKED, gym.spaces.Discrete(4))
    config = rc.RunnerConfig(
        preset="atari", num_envs=1, rollout_fragment_length=50, seed=1,
        batch_mode="complete_episodes",
    )  # fmt: skip
    with rc.EnvRunner("ALE/Breakout-v5", policy, config=config) as runner:
        assert runner.agent_pipeline().output_space == STACKED
        assert runner.agent_pipeline().names == ["ClipReward", "FrameStack"]  # resized env-side
        batch = runner.sample()
        metrics = runner.get_metrics()
    assert batch["obs"].shape[1:] == (4, 84, 84) and batch["obs"].dtype == np.uint8
    assert batch.lazy_columns() == {"obs": "FrameStackColumn", "new_obs": "FrameStackColumn"}
    assert set(np.unique(batch["rewards"])) <= {-1.0, 0.0, 1.0}
    ep = batch.split_by_episode()[0]
    lives = np.array([info["lives"] for info in ep["infos"]])
    # one episode spans all five lives: lives are lost inside it, the game ends at 0
    assert lives[0] == 5 and lives[-1] == 0 and ep["terminateds"][-1]
    assert not ep["terminateds"][:-1].any()
    assert metrics[0]["episode_length"] == len(ep)
    # negative control: a life-loss terminal (terminal_on_life_loss) would have ended an
    # episode at each of these 5 drops
    assert (np.diff(lives) < 0).sum() == 5


def test_env_side_wrappers_and_ids():
    env = make_atari_env("ALE/Breakout-v5", noop_max=0)
    assert isinstance(env, FireReset)  # Breakout's action 1 is FIRE
    assert isinstance(env.env, ScreenFrames)
    assert env.observation_space.shape == (84, 84)  # gray from the emulator, resized
    assert env.unwrapped._frameskip == 1  # frames are skipped by the wrapper, max-pooled
    assert env.unwrapped._obs_type == "ram"  # the base env renders no screen
    assert make_atari_env("ALE/Pong-v5", grayscale=False).observation_space.shape == (84, 84, 3)
    assert make_atari_env("ALE/Pong-v5", screen_size=(105, 80)).observation_space.shape == (
        105, 80,
    )  # fmt: skip
    env.close()
    for bad in (0, (84,), (84, 84.0), True, "84"):
        with pytest.raises(ValueError, match="screen_size"):
            make_atari_env("ALE/Pong-v5", screen_size=bad)
    with pytest.raises(ValueError, match="frame_skip"):
        make_atari_env("ALE/Pong-v5", frameskip=4)
    with pytest.raises(ValueError, match="grayscale"):
        make_atari_env("ALE/Pong-v5", obs_type="rgb")
    assert is_atari_id("ALE/Pong-v5") and is_atari_id("PongNoFrameskip-v4")
    assert not is_atari_id("CartPole-v1")


def test_preset_in_env_workers_gives_the_in_process_rows():
    """Pong with the preset in 2 env workers: the frames are resized in the workers (84x84
    frames cross the shared block), and every batch equals the in-process run's."""
    policy = rc.RandomPolicy(STACKED, gym.spaces.Discrete(6))
    batches = []
    for workers in (0, 2):
        config = rc.RunnerConfig(
            preset="atari", num_envs=2, rollout_fragment_length=24, seed=3,
            num_env_workers=workers,
        )  # fmt: skip
        with rc.EnvRunner("ALE/Pong-v5", policy, config=config) as runner:
            assert runner.agent_pipeline().names == ["ClipReward", "FrameStack"]
            batches.append([runner.sample() for _ in range(2)])
    assert_same_batches(*batches)
