"""The connectors on the tensor path (docs/gpu.md): numpy vs torch on the same rows,
masks, reset_where, no host read, deferred checks, and state portable across paths.

Every built-in is also checked on tensors through ConnectorTestMixin's
``test_tensor_matches_numpy`` (test_checker_builtins.py, tests/pixels); here are the
behaviours that check does not spell out.
"""

from __future__ import annotations

import contextlib
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import tree

import rlconnect as rc
from rlconnect.checker import PipelineCheckError, check_tensor_matches_numpy
from rlconnect.spaces import stack_samples
from rlconnect.testing import HostReadCounter

N = 5  # sub-envs
OBS = gym.spaces.Box(-3.0, 3.0, (4,), np.float32)
ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))


def _ctx(obs: gym.Space = OBS, act: gym.Space = ACT, **kw: Any) -> rc.ConnectorContext:
    return rc.ConnectorContext(obs, act, **kw)


def _rows(obs: Any, mask: Any = None, rewards: Any = None, t: int = 0) -> rc.AgentData:
    obs = tree.map_structure(torch.as_tensor, obs)
    n = len(tree.flatten(obs)[0])
    cols = {"obs": obs, "t": torch.full((n,), t, dtype=torch.int64)}
    if rewards is not None:
        cols["rewards"] = torch.as_tensor(rewards, dtype=torch.float32)
    return rc.AgentData(torch.arange(n), ["agent0"] * n, cols, mask=mask)


def _numpy_rows(obs: Any, env_ids: Any, rewards: Any = None) -> rc.AgentData:
    cols = {"obs": obs}
    if rewards is not None:
        cols["rewards"] = np.asarray(rewards, np.float32)
    return rc.AgentData(env_ids, ["agent0"] * len(env_ids), cols)


def _obs(rng: np.random.Generator, n: int = N) -> np.ndarray:
    return rng.normal(size=(n, 4)).astype(np.float32)


# -- the data and the context -------------------------------------------------------------


def test_agent_data_keeps_tensor_env_ids_and_checks_the_mask():
    data = rc.AgentData(torch.arange(3, dtype=torch.int32), ["a"] * 3, {"obs": torch.zeros(3, 2)})
    assert data.on_tensors and data.env_ids.dtype == torch.int64 and data.mask is None
    masked = rc.AgentData(torch.arange(3), ["a"] * 3, {}, mask=torch.tensor([True, False, True]))
    assert masked.copy().mask is masked.mask
    with pytest.raises(ValueError, match=r"mask must be None or a bool array of shape \(3,\)"):
        rc.AgentData(torch.arange(3), ["a"] * 3, {}, mask=torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="got int64"):
        rc.AgentData([0, 1], ["a"] * 2, {}, mask=np.array([1, 0]))
    assert not rc.AgentData([0], ["a"], {"obs": np.zeros((1, 2))}).on_tensors


def test_a_numpy_pipeline_refuses_a_mask():
    pipe = rc.AgentConnectorPipeline(_ctx(), [rc.ClipReward(_ctx())])
    data = rc.AgentData([0, 1], ["a"] * 2, {"rewards": np.ones(2)}, mask=np.array([True, False]))
    with pytest.raises(ValueError, match="pass only the real rows"):
        pipe(data)


def test_context_device_is_a_string_or_none():
    assert _ctx().device is None
    assert _ctx(device=torch.device("cpu")).device == "cpu"
    with pytest.raises(TypeError, match="torch device string"):
        _ctx(device=0)


def test_default_action_pipeline_for_a_device_leaves_out_convert_to_numpy():
    assert rc.default_action_pipeline(_ctx()).names == ["ConvertToNumpy", "UnsquashActions"]
    assert rc.default_action_pipeline(_ctx(device="cpu")).names == ["UnsquashActions"]


# -- declaring tensor support ---------------------------------------------------------------


class _NumpyOnly(rc.ObservationConnector):
    def transform(self, value: Any) -> Any:
        return np.asarray(value) * 0.5


class _ReadsTheHost(rc.ObservationConnector):
    takes_tensors = True

    def transform(self, value: Any) -> Any:
        return value * float(abs(value).max())  # a host read per call on tensors


class _Differs(rc.ObservationConnector):
    takes_tensors = True

    def transform(self, value: Any) -> Any:
        return value * 2

    def transform_tensor(self, value: Any) -> Any:
        return value * 3


def test_builtins_take_tensors_and_a_user_connector_is_refused_by_name():
    ctx = _ctx(initial_states=[np.zeros(3, np.float32)], config={"framestack": 2})
    pipe = rc.default_agent_pipeline(ctx)
    assert pipe.takes_tensors and pipe.tensor_refusals() == []
    pipe.append(_NumpyOnly(ctx))
    assert not pipe.takes_tensors and pipe.tensor_refusals() == ["_NumpyOnly"]
    with pytest.raises(PipelineCheckError, match="do not take tensors") as err:
        check_tensor_matches_numpy(pipe, device="cpu")
    assert err.value.member == "_NumpyOnly"


def test_the_tensor_check_names_a_host_read_and_a_difference():
    with pytest.raises(PipelineCheckError, match=r"host read.*__float__") as err:
        check_tensor_matches_numpy(_ReadsTheHost(_ctx()), device="cpu")
    assert err.value.check == "tensor_matches_numpy" and err.value.member == "_ReadsTheHost"
    with pytest.raises(PipelineCheckError, match=r"on numpy vs .* on tensors"):
        check_tensor_matches_numpy(_Differs(_ctx()), device="cpu")


def test_host_read_counter_counts_reads_and_only_reads():
    x = torch.arange(4.0)
    with HostReadCounter() as reads:
        y = torch.where(x > 1, x, 0.0) * 2
        _ = y[torch.tensor([0, 2])]
    assert reads.total == 0
    with HostReadCounter() as reads:
        bool(x[0] > 0), x.sum().item(), x.tolist(), np.asarray(x), x[x > 1], x.nonzero()
        torch.where(x > 2)
    assert reads.by_name == {
        "where": 1,
        "__bool__": 1,
        "item": 1,
        "tolist": 1,
        "__array__": 1,
        "x[bool mask]": 1,
        "nonzero": 1,
    }


# -- a whole pipeline, steady state ----------------------------------------------------------


def _full_pipes(ctx: rc.ConnectorContext) -> tuple[Any, Any]:
    agent = rc.default_agent_pipeline(ctx)
    agent.append(rc.PrevActionsRewards(ctx))
    return agent, rc.default_action_pipeline(ctx)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
"""The devices the tensor tests run on: the CPU always, a GPU where there is one."""


def _no_sync(device: str) -> Any:
    """On a GPU, any synchronising call inside the block raises (torch's sync debug mode);
    on the CPU, nothing (the host-read counter stands in)."""
    if not device.startswith("cuda"):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def guard() -> Any:
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    return guard()


def _poll_inputs(rng: np.random.Generator, device: str) -> list[dict[str, Any]]:
    """Six polls of rows built on ``device`` beforehand (building them copies from the host)."""
    polls = []

    def as_t(x: Any, **kw: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=device, **kw)

    for _ in range(6):
        mask = as_t(rng.random(N) < 0.3)
        cols = {"obs": as_t(_obs(rng)), "rewards": as_t(rng.normal(size=N), dtype=torch.float32)}
        first = {"obs": as_t(_obs(rng)), "rewards": torch.zeros(N, device=device)}
        polls.append(
            {
                "rows": rc.AgentData(as_t(np.arange(N)), ["agent0"] * N, cols),
                "first": rc.AgentData(as_t(np.arange(N)), ["agent0"] * N, first, mask=mask),
                "actions": as_t(rng.normal(size=(N, 2)), dtype=torch.float32),
                "ended": mask,
            }
        )
    return polls


@pytest.mark.parametrize("device", DEVICES)
def test_a_steady_state_poll_reads_nothing_on_the_host(device):
    config = {"observation_filter": "MeanStdFilter", "clip_rewards": 1.0, "framestack": 3}
    ctx = _ctx(config=config, initial_states=[np.zeros(2, np.float32)], device=device)
    agent, action = _full_pipes(ctx)
    agent.to(device)
    reads_per_poll = []
    for i, poll in enumerate(_poll_inputs(np.random.default_rng(0), device)):
        # the first poll copies each connector's constants (bounds, initial states) to the
        # device once; from the second on, nothing may wait for the device
        guard = _no_sync(device) if i else contextlib.nullcontext()
        with HostReadCounter() as reads, guard:
            data = agent(poll["rows"])
            out = rc.ActionData(
                data.env_ids,
                data.agent_ids,
                {"actions": poll["actions"], "state_out_0": data["state_in_0"] + 1},
            )
            agent.on_policy_output(out)
            env_actions = action(out)["actions"]
            agent.reset_where(poll["ended"])
            agent(poll["first"])
            flags = agent.pending_flags()
        reads_per_poll.append(reads.total)
    assert reads_per_poll == [0] * 6
    assert env_actions.device.type == torch.device(device).type
    assert list(flags) == ["MeanStdFilter"]
    assert not bool(torch.stack(list(flags.values())).any())


@pytest.mark.parametrize("device", DEVICES)
def test_default_pipelines_match_numpy_on_each_device(device):
    config = {"observation_filter": "MeanStdFilter", "clip_rewards": True, "framestack": 2}
    space = gym.spaces.Dict({"pos": OBS, "mode": gym.spaces.MultiDiscrete([3, 2])})
    ctx = _ctx(space, config=config, initial_states=[np.zeros(2, np.float32)])
    check_tensor_matches_numpy(
        rc.default_agent_pipeline(ctx),
        device=device,
        env_ids=[0, 1, 2, 3, 0, 1, 2, 3],
        agent_ids=["red"] * 4 + ["blue"] * 4,  # agent-major blocks, as for VMAS
    )
    action_pipe = rc.default_action_pipeline(_ctx(config={"clip_actions": True}))
    check_tensor_matches_numpy(action_pipe, device=device)


# -- MeanStdFilter ---------------------------------------------------------------------------


def test_mean_std_filter_on_tensors_matches_numpy_with_masks():
    rng = np.random.default_rng(1)
    on_numpy, on_tensors = rc.MeanStdFilter(_ctx()), rc.MeanStdFilter(_ctx())
    for step in range(5):
        obs = _obs(rng) * (step + 1)
        real = rng.random(N) < 0.6
        want = on_numpy(_numpy_rows(obs[real], np.flatnonzero(real)))["obs"]
        got = on_tensors(_rows(obs, mask=torch.as_tensor(real)))["obs"]
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy()[real], want, rtol=1e-5, atol=1e-6)
    a, b = on_numpy.get_statistics(), on_tensors.get_statistics()
    assert float(b["count"]) == float(a["count"])
    np.testing.assert_allclose(b["mean"], a["mean"], rtol=1e-12)
    np.testing.assert_allclose(b["m2"], a["m2"], rtol=1e-12)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float64 for v in b.values())


def test_mean_std_filter_updates_only_in_training():
    f = rc.MeanStdFilter(_ctx())
    f(_rows(_obs(np.random.default_rng(2))))
    before = f.get_statistics()
    f.in_eval()
    f(_rows(_obs(np.random.default_rng(3)) + 5))
    after = f.get_statistics()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_mean_std_filter_defers_the_nonfinite_check_and_keeps_those_rows_out():
    rng = np.random.default_rng(4)
    obs = _obs(rng)
    obs[3, 2] = np.nan
    obs[1, 0] = np.inf
    f = rc.MeanStdFilter(_ctx())
    assert f.pending_nonfinite() is None
    with HostReadCounter() as reads:
        f(_rows(obs))
        flag = f.pending_nonfinite()
    assert reads.total == 0 and bool(flag)
    finite = rc.MeanStdFilter(_ctx())
    finite(_numpy_rows(obs[[0, 2, 4]], [0, 2, 4]))
    np.testing.assert_allclose(f.mean, finite.mean, rtol=1e-12)
    with pytest.raises(ValueError, match=r"2 row\(s\).*env_id=1.*features \[0\].*env_id=3.*\[2\]"):
        f.raise_pending()
    assert not bool(f.pending_nonfinite())
    f.raise_pending()  # cleared: nothing left to raise
    pipe = rc.AgentConnectorPipeline(_ctx(), [f])
    pipe(_rows(obs))
    with pytest.raises(ValueError, match="non-finite"):
        pipe.raise_pending([n for n, flag in pipe.pending_flags().items() if bool(flag)])


def test_statistics_saved_on_tensors_load_on_numpy_and_back(tmp_path):
    rng = np.random.default_rng(5)
    ctx = _ctx(config={"observation_filter": "MeanStdFilter", "observation_filter_sync": "frozen"})
    on_tensors = rc.default_agent_pipeline(ctx)
    for _ in range(3):
        on_tensors(_rows(_obs(rng)))
    on_tensors.start_sample()
    on_tensors(_rows(_obs(rng)))  # totals now differ from the frozen statistics
    rc.save_pipeline(on_tensors, tmp_path / "gpu.pipeline")
    on_numpy = rc.load_pipeline(tmp_path / "gpu.pipeline", ctx)
    probe = _obs(rng)
    want = on_tensors["MeanStdFilter"].transform(torch.as_tensor(probe)).numpy()
    np.testing.assert_allclose(on_numpy["MeanStdFilter"].transform(probe), want, rtol=1e-6)
    on_numpy(_numpy_rows(_obs(rng), np.arange(N)))
    rc.save_pipeline(on_numpy, tmp_path / "cpu.pipeline")
    back = rc.load_pipeline(tmp_path / "cpu.pipeline", ctx)
    got = back(_rows(probe))["obs"].numpy()
    expect = on_numpy(_numpy_rows(probe, np.arange(N)))["obs"]
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)


def test_mean_std_filter_state_moves_with_to():
    f = rc.MeanStdFilter(_ctx())
    f.to("cpu")
    assert isinstance(f._total[1], torch.Tensor)
    f(_numpy_rows(_obs(np.random.default_rng(6)), np.arange(N)))  # back to numpy
    assert isinstance(f._total[1], np.ndarray) and f.count == N


# -- per-row state: FrameStack, PrevActionsRewards, StateBuffer --------------------------------


def _replay_both(make: Any, steps: int, seed: int, feed: Any = None) -> None:
    """The same episodes on numpy (only real rows, reset(env_id)) and on tensors (every row,
    mask, reset_where); outputs compared on the real rows."""
    rng = np.random.default_rng(seed)
    on_numpy, on_tensors = make(), make()
    for t in range(steps):
        obs, rewards = _obs(rng), rng.normal(size=N).astype(np.float32)
        real = np.ones(N, bool) if t % 2 == 0 else rng.random(N) < 0.5
        want = on_numpy(_numpy_rows(obs[real], np.flatnonzero(real), rewards[real]))
        mask = None if real.all() else torch.as_tensor(real)
        got = on_tensors(_rows(obs, mask=mask, rewards=rewards, t=t))
        for col in want:
            got_col = tree.map_structure(lambda x, r=real: x.numpy()[r], got[col])
            tree.map_structure(
                lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got_col, want[col]
            )
        if feed is not None:
            feed(on_numpy, on_tensors, want, got, real, rng)
        ended = rng.random(N) < 0.3
        for e in np.flatnonzero(ended):
            on_numpy.reset(int(e))
        on_tensors.reset_where(torch.as_tensor(ended))


def test_frame_stack_on_tensors_matches_numpy_across_resets():
    _replay_both(lambda: rc.FrameStack(_ctx(), num_frames=3), steps=8, seed=7)


def _feed_actions(on_numpy, on_tensors, want, got, real, rng) -> None:  # type: ignore[no-untyped-def]
    actions = rng.integers(2, 6, size=N)
    on_numpy.on_policy_output(
        rc.ActionData(
            np.flatnonzero(real), ["agent0"] * int(real.sum()), {"actions": actions[real]}
        )
    )
    on_tensors.on_policy_output(
        rc.ActionData(
            torch.arange(N),
            ["agent0"] * N,
            {"actions": torch.as_tensor(actions)},
            mask=torch.as_tensor(real),
        )
    )


def test_prev_actions_rewards_on_tensors_matches_numpy_across_resets():
    ctx = _ctx(act=gym.spaces.Discrete(4, start=2))
    _replay_both(lambda: rc.PrevActionsRewards(ctx), steps=8, seed=8, feed=_feed_actions)


def _feed_states(on_numpy, on_tensors, want, got, real, rng) -> None:  # type: ignore[no-untyped-def]
    bump = rng.normal(size=(N, 1)).astype(np.float32)
    for data, rows, mask in ((want, np.flatnonzero(real), None), (got, np.arange(N), real)):
        cols = {}
        for i in range(2):
            state = data[f"state_in_{i}"]
            add = bump[rows] if mask is None else torch.as_tensor(bump)
            cols[f"state_out_{i}"] = state + add.reshape(-1, *([1] * (state.ndim - 1)))
        if mask is None:
            on_numpy.on_policy_output(rc.ActionData(rows, ["agent0"] * len(rows), cols))
        else:
            m = torch.as_tensor(mask)
            on_tensors.on_policy_output(rc.ActionData(torch.arange(N), ["agent0"] * N, cols, m))


def test_state_buffer_on_tensors_matches_numpy_across_resets():
    init = [np.full(3, 0.5, np.float32), np.zeros((2, 2), np.float32)]
    ctx = _ctx(initial_states=init)
    _replay_both(lambda: rc.StateBuffer(ctx), steps=8, seed=9, feed=_feed_states)


def test_state_buffer_multi_agent_layout_resets_each_ended_sub_env():
    """VMAS-like rows: agent-major blocks, env_ids [0, 1, 2, 0, 1, 2]."""
    ctx = _ctx(initial_states=[np.zeros(2, np.float32)])
    buf = rc.StateBuffer(ctx)
    env_ids = torch.arange(3).repeat(2)
    data = rc.AgentData(env_ids, ("red",) * 3 + ("blue",) * 3, {"obs": torch.zeros(6, 4)})
    buf(data)
    buf.on_policy_output(rc.ActionData(env_ids, data.agent_ids, {"state_out_0": torch.ones(6, 2)}))
    buf.reset_where(torch.tensor([False, True, False]))
    state = buf(data)["state_in_0"][:, 0]
    assert state.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="no 'state_out_0' column"):
        buf.on_policy_output(rc.ActionData(env_ids, data.agent_ids, {}))


# -- FlattenObservations and the stateless ones ------------------------------------------------

SPACES = {
    "box": gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    "discrete": gym.spaces.Discrete(4, start=-1),
    "multidiscrete": gym.spaces.MultiDiscrete([[2, 3], [4, 1]], start=[[0, 1], [2, 0]]),
    "multibinary": gym.spaces.MultiBinary(5),
    "dict": gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1.0, 1.0, (2,)), "mode": gym.spaces.Discrete(3, start=1)}
    ),
    "tuple": gym.spaces.Tuple((gym.spaces.MultiDiscrete([3, 2]), gym.spaces.MultiBinary(2))),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_flatten_observations_on_tensors_matches_numpy(name):
    space = SPACES[name]
    space.seed(10)
    obs = stack_samples(space, [space.sample() for _ in range(7)])
    f = rc.FlattenObservations(_ctx(space))
    want = f(_numpy_rows(obs, np.arange(7)))["obs"]
    with HostReadCounter() as reads:
        got = f(_rows(obs))["obs"]
    assert reads.total == 0 and got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), want)
    assert not bool(f.pending_flag())


def test_flatten_observations_defers_an_index_out_of_range():
    space = gym.spaces.Dict({"mode": gym.spaces.Discrete(3), "pos": gym.spaces.Box(-1, 1, (2,))})
    f = rc.FlattenObservations(_ctx(space))
    obs = {"mode": torch.tensor([0, 3, 2]), "pos": torch.zeros(3, 2)}
    masked_out = _rows(obs, mask=torch.tensor([True, False, True]))
    f(masked_out)  # the bad row is not real in this call
    assert not bool(f.pending_flag())
    out = f(_rows(obs))["obs"]
    assert out[1, :3].tolist() == [0.0, 0.0, 0.0] and bool(f.pending_flag())
    with pytest.raises(ValueError, match=r"out of range\) in rows \(env_id=1"):
        f.raise_pending()


def test_action_connectors_on_tensors_match_numpy_for_int_and_infinite_boxes():
    int_box = gym.spaces.Box(-3, 4, (3,), np.int64)
    open_box = gym.spaces.Box(
        np.array([-1, -np.inf], np.float32), np.array([2, np.inf], np.float32)
    )
    raw = np.random.default_rng(11).normal(size=(6, 3)) * 4
    for space, connector in [
        (int_box, rc.ClipActions),
        (int_box, rc.UnsquashActions),
        (open_box, rc.UnsquashActions),
        (open_box, rc.ClipActions),
    ]:
        c = connector(_ctx(act=space))
        x = raw[:, : space.shape[0]].astype(np.float32)
        want = c(rc.ActionData(np.arange(6), ["a"] * 6, {"actions": x}))["actions"]
        got = c(rc.ActionData(torch.arange(6), ["a"] * 6, {"actions": torch.as_tensor(x)}))
        np.testing.assert_allclose(got["actions"].numpy(), want, rtol=1e-6)
        assert got["actions"].dtype == torch.from_numpy(want).dtype


def test_immutable_actions_hands_the_env_a_clone_on_tensors():
    c = rc.ImmutableActions(_ctx(act=gym.spaces.Discrete(3)))
    actions = torch.tensor([0, 1, 2])
    out = c(rc.ActionData(torch.arange(3), ["a"] * 3, {"actions": actions}))["actions"]
    out += 1  # an env editing its actions in place
    assert actions.tolist() == [0, 1, 2]


def test_convert_to_numpy_as_a_member_converts():
    c = rc.ConvertToNumpy(_ctx())
    out = c(rc.ActionData(torch.arange(2), ["a"] * 2, {"actions": torch.ones(2, 2)}))
    assert isinstance(out["actions"], np.ndarray)


def test_lambdas_receive_the_tensor():
    seen = []
    rc.register_lambda("tensor_path_test_double", lambda x: seen.append(type(x)) or x * 2)
    c = rc.AgentLambda(_ctx(), fn="tensor_path_test_double")
    out = c(_rows(np.ones((2, 4), np.float32)))["obs"]
    assert seen == [torch.Tensor] and out.sum().item() == 16.0


def test_prev_actions_of_a_dict_action_space_on_tensors():
    act = gym.spaces.Dict(
        {
            "move": gym.spaces.Box(-1.0, 1.0, (2,)),
            "fire": gym.spaces.Discrete(3, start=1),
            "aim": gym.spaces.MultiDiscrete([2, 3]),
        }
    )
    connector = rc.PrevActionsRewards(_ctx(act=act))
    report = rc.check_pipeline(
        connector, device="cpu", env_ids=[0, 0, 1, 1, 2, 2, 3, 3], agent_ids=["a", "b"] * 4
    )
    assert report.checks[-1] == "tensor_matches_numpy"


def test_context_from_policy_takes_a_device_and_pipelines_move_state():
    policy = rc.RandomPolicy(OBS, ACT, seed=0)
    ctx = rc.ConnectorContext.from_policy(
        policy, {"observation_filter": "MeanStdFilter"}, device="cpu"
    )
    assert ctx.device == "cpu"
    pipe = rc.default_agent_pipeline(ctx)
    pipe.to("cpu")
    assert isinstance(pipe["MeanStdFilter"]._total[1], torch.Tensor)
    with HostReadCounter() as reads:
        pipe(_rows(_obs(np.random.default_rng(12))))
    assert reads.total == 0 and pipe["MeanStdFilter"].count == N
