"""LSTMPolicy: the built-in recurrent policy (an MLP encoder, an LSTM, linear heads).

Its state is ``[h, c]``, two ``(cell_size,)`` float32 arrays, zeros at an episode's start.
The runner keeps them per agent (``StateBuffer``) and records them as ``state_in_0/1`` and
``state_out_0/1``. A learner replays recorded rows with :meth:`LSTMModel.forward_sequences`
on the padded sequences of :func:`rlconnect.chop_into_sequences`, starting each sequence
from its stored ``state_in_*``.

Like :class:`~rlconnect.policy.mlp.MLPPolicy`, batches of at most ``numpy_threshold`` rows
run in numpy with float32 copies of the weights (a torch call's fixed cost dominates a
64-unit LSTM step at the batch sizes of a sampler); the copies follow in-place optimizer
steps on ``policy.model.parameters()`` by themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlconnect.policy.base import PolicyOutput, WeightShapes, check_seed
from rlconnect.policy.distributions import ActionDistSpec
from rlconnect.policy.mlp import (
    _numpy_forward,
    _numpy_layers,
    _NumpyLayers,
    box_in_dim,
    init_generator,
    linear_shapes,
    numpy_threshold_of,
    param_key,
)
from rlconnect.policy.torch_policy import DeviceLike, TorchPolicy

__all__ = ["LSTMModel", "LSTMPolicy"]

_State = list[torch.Tensor]


class LSTMModel(nn.Module):
    """obs -> tanh MLP encoder -> one-layer ``nn.LSTM`` -> linear policy head (and value head).

    ``forward(obs, [h, c])`` runs one step of B rows; :meth:`forward_sequences` runs
    ``(B, T)`` padded sequences from given initial states under a mask.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hiddens: Sequence[int] = (64,),
        cell_size: int = 64,
        vf_head: bool = False,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        layers: list[nn.Module] = []
        width = in_dim
        for h in hiddens:
            layers += [nn.Linear(width, h), nn.Tanh()]
            width = h
        self.encoder = nn.Sequential(*layers)
        self.lstm = nn.LSTM(width, cell_size, batch_first=True)
        self.pi = nn.Linear(cell_size, out_dim)
        self.vf = nn.Linear(cell_size, 1) if vf_head else None
        self.cell_size = cell_size

    def init_weights(self, generator: torch.Generator) -> None:
        """Orthogonal init (gain sqrt(2) encoder, 1 LSTM, 0.01 policy, 1 value); zero biases
        except the LSTM forget gate's (1, so the cell keeps its memory from the start)."""
        for lin in self.encoder:
            if isinstance(lin, nn.Linear):
                nn.init.orthogonal_(lin.weight, gain=2**0.5, generator=generator)
                nn.init.zeros_(lin.bias)
        w_ih, w_hh, b_ih, b_hh = self.lstm_parameters()
        for w in (w_ih, w_hh):
            nn.init.orthogonal_(w, generator=generator)
        for b in (b_ih, b_hh):
            nn.init.zeros_(b)
        with torch.no_grad():
            b_ih[self.cell_size : 2 * self.cell_size] = 1.0  # gate order i, f, g, o
        for head, gain in ((self.pi, 0.01), (self.vf, 1.0)):
            if head is not None:
                nn.init.orthogonal_(head.weight, gain=gain, generator=generator)
                nn.init.zeros_(head.bias)

    def lstm_parameters(self) -> tuple[nn.Parameter, ...]:
        """The LSTM's ``(weight_ih, weight_hh, bias_ih, bias_hh)``, gates in the order
        input, forget, cell, output (torch's layout)."""
        return tuple(self.lstm.all_weights[0])

    def get_initial_state(self) -> _State:
        """``[h, c]``: zeros of shape ``(cell_size,)``."""
        return [torch.zeros(self.cell_size), torch.zeros(self.cell_size)]

    def _float(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the parameters' dtype (observations may come as float64 or ints)."""
        dtype = self.pi.weight.dtype
        return x if x.dtype == dtype else x.to(dtype)

    def _outputs(self, h: torch.Tensor, state: _State) -> tuple[Any, ...]:
        dist_inputs = self.pi(h)
        if self.vf is None:
            return dist_inputs, state
        return dist_inputs, state, self.vf(h)[..., 0]

    def forward(self, obs: torch.Tensor, state: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        """One step: obs ``(B, *shape)``, ``[h, c]`` ``(B, cell_size)`` ->
        ``(dist_inputs (B, w), [h, c])`` plus values ``(B,)`` with a value head."""
        x = self.encoder(self._float(obs).reshape(obs.shape[0], self.in_dim))  # 0 rows too
        h0, c0 = (self._float(s)[None] for s in state)
        out, (h, c) = self.lstm(x[:, None], (h0, c0))
        return self._outputs(out[:, 0], [h[0], c[0]])

    def forward_sequences(
        self, obs: torch.Tensor, state: Sequence[torch.Tensor], mask: torch.Tensor
    ) -> tuple[Any, ...]:
        """Padded sequences: obs ``(B, T, *shape)``, ``[h0, c0]`` ``(B, cell_size)``, bool
        ``mask (B, T)`` -> ``(dist_inputs (B, T, w), [h, c])`` plus values ``(B, T)`` with a
        value head. A row whose mask is False keeps the state it had (any mask pattern);
        outputs there are unspecified. ``[h, c]`` is the state after each sequence's last
        unmasked row (the initial state for a sequence without any).

        A mask that is True on a prefix of each sequence (what ``chop_into_sequences``
        makes) runs as one fused ``nn.LSTM`` call; other patterns step row by row."""
        b, t = obs.shape[:2]
        x = self.encoder(self._float(obs).reshape(b * t, -1)).reshape(b, t, -1)
        mask = mask.to(device=x.device, dtype=torch.bool)
        lengths = mask.sum(1)
        h0, c0 = self._float(state[0]), self._float(state[1])
        if not bool((mask == (torch.arange(t, device=x.device) < lengths[:, None])).all()):
            return self._masked_steps(x, [h0, c0], mask)
        if bool((lengths == t).all()):
            out, (h, c) = self.lstm(x, (h0[None], c0[None]))
            return self._outputs(out, [h[0], c[0]])
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        out_packed, (h, c) = self.lstm(packed, (h0[None], c0[None]))
        out = nn.utils.rnn.pad_packed_sequence(out_packed, batch_first=True, total_length=t)[0]
        empty = (lengths == 0)[:, None]  # clamped to one step above: keep their state
        return self._outputs(out, [torch.where(empty, h0, h[0]), torch.where(empty, c0, c[0])])

    def _masked_steps(self, x: torch.Tensor, state: _State, mask: torch.Tensor) -> tuple[Any, ...]:
        """Any mask pattern: one LSTM step per time step, masked rows keep their state."""
        h, c = state[0][None], state[1][None]
        hs = []
        for i in range(x.shape[1]):
            _, (h_new, c_new) = self.lstm(x[:, i : i + 1], (h, c))
            keep = mask[None, :, i, None]
            h, c = torch.where(keep, h_new, h), torch.where(keep, c_new, c)
            hs.append(h[0])
        return self._outputs(torch.stack(hs, dim=1), [h[0], c[0]])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function without overflow: 0.5 * (1 + tanh(x / 2))."""
    x *= 0.5
    np.tanh(x, out=x)
    x += 1.0
    x *= 0.5
    return x


class LSTMPolicy(TorchPolicy):
    """A recurrent :class:`TorchPolicy` over :class:`LSTMModel`, rebuildable by name.

    The observation space must be a Box (observations are flattened); the action space
    Discrete, MultiDiscrete or Box. Batches of at most ``numpy_threshold`` rows (default
    4096, 0 disables) run in numpy on float32 copies of the same weights and sample with
    ``self.np_random``; their ``action_dist_inputs`` / ``vf_preds`` / states equal the torch
    path's to float32 rounding. ``seed`` fixes the initial weights and the sampling.

    >>> import gymnasium as gym, numpy as np
    >>> p = LSTMPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), seed=0)
    >>> [s.shape for s in p.get_initial_state()]
    [(64,), (64,)]
    >>> zeros = np.zeros((3, 64), np.float32)
    >>> batch = {"obs": np.ones((3, 4), np.float32), "state_in_0": zeros, "state_in_1": zeros}
    >>> actions, (h, c), extra = p.compute_actions(batch)
    >>> h.shape, c.dtype, sorted(extra)
    ((3, 64), dtype('float32'), ['action_dist_inputs', 'action_logp'])
    >>> rebuilt = LSTMPolicy(p.observation_space, p.action_space, **p.get_config())

    Args:
        observation_space: a Box.
        action_space: Discrete, MultiDiscrete or Box.
        config: free-form options; ``numpy_threshold`` is read from it.
        hiddens: sizes of the tanh encoder layers before the LSTM (may be empty).
        cell_size: the LSTM's state size.
        vf_head: add a linear value head on the LSTM output (the ``vf_preds`` fetch).
        numpy_threshold: overrides ``config["numpy_threshold"]`` when given.
        seed: seeds the weight init and both generators.
        device: where the model runs (see :class:`TorchPolicy`; not saved in the spec).
            Tensor observations and states (``state_in_0/1`` (B, cell_size)) always take
            torch and give tensor ``state_outs`` on the input's device.
    """

    model: LSTMModel

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: dict | None = None,
        *,
        hiddens: Sequence[int] = (64,),
        cell_size: int = 64,
        vf_head: bool = False,
        numpy_threshold: int | None = None,
        seed: int | None = None,
        device: DeviceLike = None,
    ) -> None:
        in_dim = box_in_dim("LSTMPolicy", observation_space)
        hiddens = [_positive("hiddens", h) for h in hiddens]
        cell_size = _positive("cell_size", cell_size)
        config = dict(config or {})
        numpy_threshold = config["numpy_threshold"] = numpy_threshold_of(config, numpy_threshold)
        self.hiddens, self.cell_size, self.vf_head = hiddens, cell_size, bool(vf_head)
        self.numpy_threshold = numpy_threshold
        self.in_dim = in_dim
        model = LSTMModel(
            self.in_dim, ActionDistSpec(action_space).width, hiddens, cell_size, self.vf_head
        )
        seed = check_seed(seed)
        model.init_weights(init_generator(seed))
        super().__init__(model, observation_space, action_space, config, seed=seed, device=device)
        self._params = list(self.model.parameters())
        self._param_key: tuple = ()
        self._on_weights_changed()

    @staticmethod
    def _shapes_of_arguments(arguments: Mapping[str, Any]) -> WeightShapes:
        """``LSTMModel``'s weights for these constructor arguments, without building it
        (see ``Policy.weight_shapes``)."""
        in_dim = box_in_dim("LSTMPolicy", arguments["observation_space"])
        cell = _positive("cell_size", arguments["cell_size"])
        out_dim = ActionDistSpec(arguments["action_space"]).width
        return _lstm_shapes(in_dim, arguments["hiddens"], cell, out_dim, arguments["vf_head"])

    # -- numpy mirror ----------------------------------------------------------------------

    def sync_numpy_weights(self) -> None:
        """Refresh the numpy copies from the torch parameters (automatic in most cases)."""
        self._param_key = param_key(self._params)
        m = self.model
        self._np_encoder = _numpy_layers(m.encoder)
        w_ih, w_hh, b_ih, b_hh = (p.detach().cpu().numpy() for p in m.lstm_parameters())
        n = self.cell_size
        # one (W_ih^T, W_hh^T, bias) per gate: products as small as an MLP layer's, which a
        # multi-threaded BLAS runs on one thread (a (64, 256) product of 64 rows it splits
        # across threads, which costs 20x more CPU on a busy machine than it saves)
        self._np_gates = [
            (
                np.ascontiguousarray(w_ih[k * n : (k + 1) * n].T, np.float32),
                np.ascontiguousarray(w_hh[k * n : (k + 1) * n].T, np.float32),
                (b_ih[k * n : (k + 1) * n] + b_hh[k * n : (k + 1) * n]).astype(np.float32),
            )
            for k in range(4)
        ]
        self._np_pi = _numpy_layers(nn.Sequential(m.pi))
        self._np_vf = _numpy_layers(nn.Sequential(m.vf)) if m.vf is not None else None

    def _on_weights_changed(self) -> None:
        """Refresh the mirror of a CPU policy now; on another device only mark it stale."""
        if self.device.type == "cpu":
            self.sync_numpy_weights()
        else:
            self._param_key = ()

    # -- inference -------------------------------------------------------------------------

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> PolicyOutput:
        """As :meth:`TorchPolicy.compute_actions`; small batches take the numpy path."""
        obs = input_batch["obs"]
        b = len(obs)
        if not self._numpy_serves(obs, b, self.numpy_threshold):
            return super().compute_actions(input_batch, explore)
        return self._compute_actions_numpy(input_batch, b, explore)

    def compute_values(self, input_batch: Mapping[str, Any]) -> Any:
        """The value head's output (B,) float32 after one step from ``state_in_*``, on the
        same path (numpy or torch) that :meth:`compute_actions` takes for a batch of this
        size, so it equals ``vf_preds`` (a tensor on ``obs``'s device for tensor ``obs``).

        Raises:
            NotImplementedError: the policy was built without ``vf_head=True``.
        """
        if not self.vf_head:
            raise NotImplementedError(self._no_value_head())
        obs = input_batch["obs"]
        b = len(obs)
        if not self._numpy_serves(obs, b, self.numpy_threshold):
            return super().compute_values(input_batch)
        h_new, _ = self._numpy_step(input_batch, b)
        return _numpy_forward(cast(_NumpyLayers, self._np_vf), h_new, _identity)[:, 0]

    def _numpy_step(self, input_batch: Mapping[str, Any], b: int) -> tuple[np.ndarray, np.ndarray]:
        """One LSTM step in numpy: ``(h_new, c_new)`` for the batch's obs and state."""
        if param_key(self._params) != self._param_key:
            self.sync_numpy_weights()
        x = np.asarray(input_batch["obs"], dtype=np.float32).reshape(b, -1)
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"obs rows have {x.shape[1]} elements, expected {self.in_dim} "
                f"(observation space {self.observation_space})"
            )
        h, c = (np.asarray(s, dtype=np.float32) for s in self._state_columns(input_batch))
        if self._np_encoder:
            x = np.tanh(_numpy_forward(self._np_encoder, x, np.tanh))
        i, f, g, o = (x @ wx + h @ wh + bias for wx, wh, bias in self._np_gates)
        c_new = _sigmoid(f) * c
        c_new += _sigmoid(i) * np.tanh(g)
        return _sigmoid(o) * np.tanh(c_new), c_new

    def _compute_actions_numpy(
        self, input_batch: Mapping[str, Any], b: int, explore: bool
    ) -> PolicyOutput:
        h_new, c_new = self._numpy_step(input_batch, b)
        raw, extra = self._sample_numpy(_numpy_forward(self._np_pi, h_new, _identity), explore)
        if self._np_vf is not None:
            extra["vf_preds"] = _numpy_forward(self._np_vf, h_new, _identity)[:, 0]
        return self.dist.to_env_actions(raw), [h_new, c_new], extra

    def get_config(self) -> dict[str, Any]:
        """Kwargs that rebuild this policy: ``LSTMPolicy(obs_space, act_space, **cfg)``."""
        return {
            **super().get_config(),
            "hiddens": list(self.hiddens),
            "cell_size": self.cell_size,
            "vf_head": self.vf_head,
            "numpy_threshold": self.numpy_threshold,
        }


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _lstm_shapes(
    in_dim: int, hiddens: Sequence[int], cell: int, out_dim: int, vf_head: bool
) -> WeightShapes:
    """``LSTMModel``'s weights in ``state_dict`` order (see ``LSTMPolicy.weight_shapes``)."""
    width = in_dim
    for name, shape in linear_shapes("encoder", in_dim, hiddens, 2):
        width = shape[0]
        yield name, shape
    yield "lstm.weight_ih_l0", (4 * cell, width)
    yield "lstm.weight_hh_l0", (4 * cell, cell)
    yield "lstm.bias_ih_l0", (4 * cell,)
    yield "lstm.bias_hh_l0", (4 * cell,)
    for head, out in [("pi", out_dim)] + ([("vf", 1)] if vf_head else []):
        yield f"{head}.weight", (out, cell)
        yield f"{head}.bias", (out,)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must hold positive ints, got {value!r}")
    return int(value)
