"""The env side of the Atari preset: frame skip with max-pooling, no-op and FIRE resets,
gray screens read straight from the emulator, resized to 84x84.

Where each step of the DeepMind Atari preprocessing lives in rlconnect:

============================  ===========================================================
step                          where
============================  ===========================================================
frame skip (4)                env side: ``ScreenFrames`` (gymnasium's
                              ``AtariPreprocessing(frame_skip=4)``) on a base env built
                              with ``frameskip=1``
max over the last two frames  env side: the same wrapper (removes sprite flicker)
no-op reset (1..30 no-ops)    env side: the same wrapper (``noop_max=30``)
FIRE reset                    env side: ``FireReset`` below (games whose action 1 is FIRE)
grayscale                     env side: ALE's gray screen (``ale.getScreenGrayscale``, as
                              gymnasium does); connector ``Grayscale`` (BT.601) for RGB
                              frames (``grayscale=False`` or an env of your own)
resize to 84x84 (area)        env side: the same wrapper, with the ``Resize`` connector's
                              pixels; connector ``Resize(84, 84)`` for frames of another
                              size (``screen_size=None`` or an env of your own)
reward clipped to its sign    connector: ``ClipReward``
stack of 4 frames             connector: ``FrameStack(num_frames=4)``
============================  ===========================================================

The env-side steps must see every emulator frame, which only the env has, or belong
beside the emulator: the resize, one frame at a time, costs the in-process runner a few
percent more than one batch would (``benchmarks/bench_pixels.py``), and with
``num_env_workers`` it runs in the worker processes instead of in the runner they all
wait on. The rest are batched over all sub-envs by the connectors
(``RunnerConfig(preset="atari")``). Reading the gray
screen from the emulator costs a third of reading RGB and converting it, and the base env
(``obs_type="ram"``) renders no screen on the frames the wrapper skips. Episodes are whole
games: a lost life never ends an episode, so episode metrics (``episode_reward``,
``episode_len``) count whole games across lives; ``info["lives"]`` reports the lives left.

The base env keeps ALE's v5 defaults otherwise (sticky actions with probability 0.25, the
minimal action set). ``ale-py`` ships the ROMs in its wheel: nothing is downloaded.

>>> import rlconnect as rc
>>> from rlconnect.envs.atari import make_atari_env
>>> make_atari_env("ALE/Pong-v5").observation_space.shape
(84, 84)
>>> make_atari_env("ALE/Pong-v5", screen_size=None).observation_space.shape
(210, 160)
>>> make_atari_env("ALE/Pong-v5", grayscale=False).observation_space.shape
(84, 84, 3)
"""

from __future__ import annotations

import numbers
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlconnect.connectors.agent.pixels_resize import MAX_SIDE, FrameResizer
from rlconnect.connectors.defaults import ATARI_SCREEN

__all__ = ["FireReset", "ScreenFrames", "atari_env_creator", "is_atari_id", "make_atari_env"]


def is_atari_id(env_id: str) -> bool:
    """True for ids of ale-py's games (``"ALE/Pong-v5"``, ``"PongNoFrameskip-v4"``...)."""
    if env_id.startswith("ALE/"):
        return True
    try:
        _register_ale()
    except ImportError:
        return False
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return False
    return "ale_py" in str(spec.entry_point)


def _register_ale() -> None:
    try:
        import ale_py
    except ImportError as exc:
        raise ImportError(
            "Atari games need ale-py: pip install 'rlconnect[atari]' (its wheel carries the ROMs)"
        ) from exc
    gym.register_envs(ale_py)


class FireReset(gym.Wrapper):
    """After each reset, presses FIRE (action 1) so games like Breakout start at once.

    Only applied by ``make_atari_env`` when the game's action 1 means ``"FIRE"``. If the
    press ends the game (it never does in practice), the env is reset again without it.
    """

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        """Reset, then press FIRE once; reset again if that press ended the episode."""
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class ScreenFrames(gym.wrappers.AtariPreprocessing):
    """gymnasium's ``AtariPreprocessing`` (frame skip, max over the last two frames, no-op
    resets) reading the screen straight from the emulator, gray or RGB, resized or not.

    The base env must be built with ``obs_type="ram"``: it then renders no screen on the
    frames in between (the wrapper reads the screen itself on the last two of each step).
    Frames are resized by area (``FrameResizer``, the pixels of the ``Resize`` connector;
    gymnasium uses OpenCV's ``INTER_AREA``, which is slower per frame and rounds a rare
    pixel one level the other way); at native size nothing is resized.

    Args:
        env: an ale-py env made with ``frameskip=1, obs_type="ram"``.
        grayscale: read ALE's gray screen (``ale.getScreenGrayscale``, as gymnasium's
            ``grayscale_obs=True``) instead of RGB.
        screen_size: ``(height, width)`` of the frames; None: the native ``(210, 160)``.
        **kwargs: ``noop_max``, ``frame_skip`` as for ``AtariPreprocessing``.
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        grayscale: bool = True,
        screen_size: tuple[int, int] | None = None,
        **kwargs: Any,
    ) -> None:
        native = tuple(env.unwrapped.ale.getScreenDims())  # type: ignore[attr-defined]
        height, width = native if screen_size is None else screen_size
        super().__init__(
            env,
            screen_size=(width, height),  # gymnasium's (OpenCV's) order
            terminal_on_life_loss=False,
            grayscale_obs=grayscale,
            scale_obs=False,
            **kwargs,
        )
        shape = native if grayscale else (*native, 3)
        self.obs_buffer = [np.empty(shape, np.uint8), np.empty(shape, np.uint8)]
        resized = (height, width) != native
        self._resize = FrameResizer(native, (height, width)) if resized else None

    def _get_obs(self) -> np.ndarray:
        # as gymnasium's: the max is taken in place (a step that ends early reuses it)
        if self.frame_skip > 1:
            np.maximum(self.obs_buffer[0], self.obs_buffer[1], out=self.obs_buffer[0])
        if self._resize is None:
            return self.obs_buffer[0].copy()
        return self._resize(self.obs_buffer[0][None])[0]


def make_atari_env(
    env_id: str,
    *,
    frame_skip: int = 4,
    noop_max: int = 30,
    fire_reset: bool = True,
    grayscale: bool = True,
    screen_size: int | tuple[int, int] | None = ATARI_SCREEN,
    **make_kwargs: Any,
) -> gym.Env:
    """An ale-py game with the env-side Atari preprocessing: 84x84 gray frames by default.

    Args:
        env_id: a gymnasium id of an ale-py game, e.g. ``"ALE/Pong-v5"``.
        frame_skip: emulator frames per env step; the observation is the max of the last two.
        noop_max: at reset, take 1..noop_max no-op actions (0: none).
        fire_reset: press FIRE after reset when the game's action 1 is FIRE.
        grayscale: read gray ``(H, W)`` screens from the emulator (ALE's palette, as
            gymnasium's ``AtariPreprocessing``); False: RGB ``(H, W, 3)`` screens, for a
            ``Grayscale`` connector or a colour model.
        screen_size: frames resized (by area) to ``(height, width)``, or to a square for
            an int; None keeps the native ``(210, 160)``. Resizing here, once per frame,
            puts it where the env runs: in the env worker processes with
            ``num_env_workers``, not in the runner.
        **make_kwargs: passed on to ``gym.make`` (e.g. ``repeat_action_probability``);
            ``frameskip`` is always 1 there, the wrapper skips frames, and ``obs_type`` is
            ``"ram"`` (the wrapper reads the screen itself).
    """
    _register_ale()
    if make_kwargs.pop("frameskip", 1) != 1:
        raise ValueError(
            f"make_atari_env({env_id!r}): pass frame_skip, not frameskip (the base env must "
            "not skip frames itself, or they would be skipped twice)"
        )
    if "obs_type" in make_kwargs:
        raise ValueError(
            f"make_atari_env({env_id!r}): pass grayscale=True/False, not obs_type (the "
            "wrapper reads the screen itself)"
        )
    env = gym.make(env_id, frameskip=1, obs_type="ram", **make_kwargs)
    env = ScreenFrames(
        env,
        grayscale=grayscale,
        screen_size=_screen_size(env_id, screen_size),
        noop_max=noop_max,
        frame_skip=frame_skip,
    )
    meanings = cast(Any, env.unwrapped).get_action_meanings()  # ALE's own method
    if fire_reset and len(meanings) > 1 and meanings[1] == "FIRE":
        env = FireReset(env)
    return env


def _screen_size(env_id: str, size: Any) -> tuple[int, int] | None:
    """``screen_size`` as ``(height, width)``; a clear error for anything else."""
    if size is None:
        return None
    pair = (size, size) if isinstance(size, numbers.Integral) else size
    if isinstance(pair, tuple | list) and len(pair) == 2:
        sides = [
            int(v) for v in pair if isinstance(v, numbers.Integral) and not isinstance(v, bool)
        ]
        if len(sides) == 2 and all(1 <= v <= MAX_SIDE for v in sides):
            return sides[0], sides[1]
    raise ValueError(
        f"make_atari_env({env_id!r}): screen_size must be an int or a (height, width) pair "
        f"of ints in [1, {MAX_SIDE}], or None for the native size; got {size!r}"
    )


def atari_env_creator(env_id: str) -> Any:
    """An env creator ``EnvContext -> env`` for ``env_id``; ``ctx.config`` goes to
    ``make_atari_env`` (e.g. ``{"noop_max": 0}``)."""

    def creator(ctx: Any) -> gym.Env:
        return make_atari_env(env_id, **dict(getattr(ctx, "config", {}) or {}))

    return creator
