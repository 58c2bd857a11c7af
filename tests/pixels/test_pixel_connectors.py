"""Pixel connectors against hand-computed expectations, and through the checker mixin."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.connectors import (
    AgentData,
    ConnectorContext,
    CropObservations,
    FrameStack,
    Grayscale,
    Resize,
    ScalePixels,
    TransposeImage,
)
from rlconnect.testing import ConnectorTestMixin

RGB = gym.spaces.Box(0, 255, (6, 4, 3), np.uint8)
GRAY = gym.spaces.Box(0, 255, (6, 4), np.uint8)
ACT = gym.spaces.Discrete(3)


def _ctx(space: gym.Space = RGB, **config: Any) -> ConnectorContext:
    return ConnectorContext(space, ACT, config=dict(config))


def _run(connector: Any, obs: np.ndarray) -> np.ndarray:
    n = len(obs)
    return connector(AgentData(list(range(n)), ["a"] * n, {"obs": obs}))["obs"]


# -- hand-computed expectations ---------------------------------------------------------


def test_grayscale_bt601_by_hand():
    obs = np.zeros((2, 1, 3, 3), np.uint8)
    obs[0, 0] = [[255, 0, 0], [0, 255, 0], [0, 0, 255]]
    obs[1, 0] = [[100, 100, 100], [10, 20, 30], [255, 255, 255]]
    space = gym.spaces.Box(0, 255, (1, 3, 3), np.uint8)
    out = _run(Grayscale(_ctx(space)), obs)
    # 0.299*255=76.245, 0.587*255=149.685, 0.114*255=29.07; 0.299*10+0.587*20+0.114*30=18.15
    np.testing.assert_array_equal(out, [[[76, 150, 29]], [[100, 18, 255]]])
    assert out.dtype == np.uint8 and out.shape == (2, 1, 3)


def test_grayscale_float_stays_float_and_space():
    space = gym.spaces.Box(0.0, 1.0, (2, 2, 3), np.float32)
    out = _run(Grayscale(_ctx(space)), np.full((1, 2, 2, 3), 0.5, np.float32))
    np.testing.assert_allclose(out, 0.5, rtol=1e-6)
    assert out.dtype == np.float32
    assert Grayscale(_ctx()).output_space(RGB) == gym.spaces.Box(0, 255, (6, 4), np.uint8)
    with pytest.raises(ValueError, match="Grayscale needs"):
        Grayscale(_ctx()).output_space(GRAY)


def test_resize_area_by_hand():
    # 4x4 -> 2x2: each output is the mean of a 2x2 block; 3 -> 2 mixes the middle pixel
    img = np.arange(16, dtype=np.uint8).reshape(1, 4, 4) * 10
    space = gym.spaces.Box(0, 255, (4, 4), np.uint8)
    out = _run(Resize(_ctx(space), height=2, width=2), img)
    np.testing.assert_array_equal(out, [[[25, 45], [105, 125]]])
    row = np.array([[[0, 30, 90]]], np.float32)  # (1, 1, 3) -> (1, 1, 2)
    fspace = gym.spaces.Box(0, 255, (1, 3), np.float32)
    out = _run(Resize(_ctx(fspace), height=1, width=2), row)
    # cells [0, 1.5) and [1.5, 3): (0 + 0.5*30) / 1.5 = 10, (0.5*30 + 90) / 1.5 = 70
    np.testing.assert_allclose(out, [[[10.0, 70.0]]], rtol=1e-6)


def test_resize_bilinear_matches_torch_interpolate():
    import torch

    rng = np.random.default_rng(0)
    img = rng.uniform(0, 1, (3, 10, 7, 2)).astype(np.float32)
    space = gym.spaces.Box(0.0, 1.0, (10, 7, 2), np.float32)
    out = _run(Resize(_ctx(space), height=5, width=9, interpolation="bilinear"), img)
    ref = torch.nn.functional.interpolate(
        torch.from_numpy(img).permute(0, 3, 1, 2), size=(5, 9), mode="bilinear"
    ).permute(0, 2, 3, 1)
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5)
    assert out.shape == (3, 5, 9, 2)


def test_resize_keeps_the_whole_frame_and_declares_space():
    r = Resize(_ctx(), height=3, width=2)
    assert r.output_space(RGB) == gym.spaces.Box(0, 255, (3, 2, 3), np.uint8)
    # a constant frame stays constant: nothing is cropped, weights sum to one
    out = _run(Resize(_ctx(), height=84, width=84), np.full((2, 6, 4, 3), 200, np.uint8))
    assert out.shape == (2, 84, 84, 3) and np.all(out == 200)
    with pytest.raises(ValueError, match="height"):
        Resize(_ctx(), height=0)
    with pytest.raises(ValueError, match="interpolation"):
        Resize(_ctx(), interpolation="cubic")


def test_scale_pixels_by_hand():
    out = _run(ScalePixels(_ctx(GRAY)), np.array([[[0, 51, 255]]], np.uint8))
    np.testing.assert_allclose(out, [[[0.0, 0.2, 1.0]]], rtol=1e-6)
    assert out.dtype == np.float32
    space = ScalePixels(_ctx(GRAY)).output_space(GRAY)
    assert space.dtype == np.float32 and space.high.max() == 1.0
    with pytest.raises(ValueError, match="uint8"):
        ScalePixels(_ctx()).output_space(gym.spaces.Box(0, 1, (2, 2), np.float32))


def test_crop_by_hand():
    img = np.arange(24, dtype=np.uint8).reshape(1, 6, 4)
    out = _run(CropObservations(_ctx(GRAY), top=1, bottom=2, left=1, right=0), img)
    np.testing.assert_array_equal(out, img[:, 1:4, 1:])
    assert CropObservations(_ctx(), top=1, bottom=2, left=1).output_space(RGB).shape == (3, 3, 3)
    with pytest.raises(ValueError, match="leaves nothing"):
        CropObservations(_ctx(GRAY), top=3, bottom=3).output_space(GRAY)
    with pytest.raises(ValueError, match="top"):
        CropObservations(_ctx(), top=-1)


def test_transpose_by_hand_and_back():
    img = np.arange(2 * 6 * 4 * 3, dtype=np.uint8).reshape(2, 6, 4, 3)
    chw = _run(TransposeImage(_ctx()), img.copy())
    np.testing.assert_array_equal(chw, img.transpose(0, 3, 1, 2))
    assert chw.flags.c_contiguous
    back_ctx = _ctx(gym.spaces.Box(0, 255, (3, 6, 4), np.uint8))
    np.testing.assert_array_equal(_run(TransposeImage(back_ctx, to="HWC"), chw), img)
    assert TransposeImage(_ctx()).output_space(RGB).shape == (3, 6, 4)
    with pytest.raises(ValueError, match="to must be"):
        TransposeImage(_ctx(), to="WHC")


def test_registered_and_saved_by_name():
    names = rc.registered_connectors()
    for name in ("Grayscale", "Resize", "ScalePixels", "CropObservations", "TransposeImage"):
        assert name in names
    assert Resize(_ctx(), height=5, width=7).to_state() == (
        "Resize",
        {"height": 5, "width": 7, "interpolation": "area"},
    )


def test_framestack_on_pixel_output():
    ctx = _ctx()
    pipe = rc.AgentConnectorPipeline(
        ctx, [Grayscale(ctx), Resize(ctx, height=3, width=2), FrameStack(ctx, num_frames=4)]
    )
    assert pipe.output_space == gym.spaces.Box(0, 255, (4, 3, 2), np.uint8)
    frames = [np.full((1, 6, 4, 3), v, np.uint8) for v in (10, 20, 30)]
    outs = [_run(pipe, f) for f in frames]
    np.testing.assert_array_equal(outs[-1][0, :, 0, 0], [10, 10, 20, 30])


def test_atari_preset_pipeline_and_errors():
    raw = gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)
    pipe = rc.default_agent_pipeline(_ctx(raw, preset="atari"))
    assert pipe.names == ["Grayscale", "Resize", "ClipReward", "FrameStack"]
    assert pipe.output_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    rewards = np.array([7.0, -3.0, 0.0])
    data = AgentData([0, 1, 2], ["a"] * 3, {"obs": np.zeros((3, 210, 160, 3), np.uint8)})
    data["rewards"] = rewards
    np.testing.assert_array_equal(pipe(data)["rewards"], [1.0, -1.0, 0.0])
    # already preprocessed frames skip what is done
    done = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    assert rc.default_agent_pipeline(_ctx(done, preset="atari")).names == [
        "ClipReward",
        "FrameStack",
    ]
    with pytest.raises(ValueError, match="image observations"):
        rc.default_agent_pipeline(_ctx(gym.spaces.Box(-1, 1, (4,)), preset="atari"))
    with pytest.raises(ValueError, match="MeanStdFilter"):
        rc.default_agent_pipeline(_ctx(raw, preset="atari", observation_filter="MeanStdFilter"))
    with pytest.raises(ValueError, match="preset"):
        rc.default_agent_pipeline(_ctx(raw, preset="procgen"))


# -- the pipeline checker ------------------------------------------------------------------


class TestGrayscaleChecker(ConnectorTestMixin):
    def make_connector(self):
        return Grayscale(_ctx())


class TestResizeAreaChecker(ConnectorTestMixin):
    def make_connector(self):
        return Resize(_ctx(), height=3, width=5)


class TestResizeBilinearChecker(ConnectorTestMixin):
    def make_connector(self):
        return Resize(_ctx(GRAY), height=8, width=8, interpolation="bilinear")


class TestScalePixelsChecker(ConnectorTestMixin):
    def make_connector(self):
        return ScalePixels(_ctx())


class TestCropChecker(ConnectorTestMixin):
    def make_connector(self):
        return CropObservations(_ctx(), top=1, bottom=1, left=2)


class TestTransposeChecker(ConnectorTestMixin):
    def make_connector(self):
        return TransposeImage(_ctx())


class TestAtariPresetChecker(ConnectorTestMixin):
    def make_pipeline(self):
        return rc.default_agent_pipeline(_ctx(preset="atari"))
