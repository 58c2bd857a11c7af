"""MLPPolicy: the built-in default policy, with a numpy fast path for small batches.

At small batch sizes torch's fixed per-call cost (~60-120 us) dominates an MLP forward pass;
the same weights in numpy run several times faster. ``MLPPolicy`` therefore keeps float32
numpy copies of its weights and uses them for batches of at most ``numpy_threshold`` rows.
The copies are refreshed whenever the torch parameters change: after :meth:`set_weights`,
and when any parameter's version counter or storage changed since the last call (which
catches in-place optimizer steps on ``policy.model.parameters()``). Writes through
``param.data`` bypass version counters: call :meth:`MLPPolicy.sync_numpy_weights` after them.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlconnect.policy.base import PolicyOutput, WeightShapes, check_seed
from rlconnect.policy.distributions import ActionDistSpec
from rlconnect.policy.torch_policy import DeviceLike, TorchPolicy

__all__ = ["ACTIVATIONS", "MLPModel", "MLPPolicy"]

DEFAULT_NUMPY_THRESHOLD = 4096
_VERSION = operator.attrgetter("_version")
_DATA_PTR = torch.Tensor.data_ptr


def numpy_threshold_of(config: Mapping[str, Any], numpy_threshold: int | None) -> int:
    """The largest batch a policy runs in numpy: the argument when given, else
    ``config["numpy_threshold"]``, else the default; an int >= 0 (0 turns numpy off)."""
    if numpy_threshold is None:
        numpy_threshold = config.get("numpy_threshold", DEFAULT_NUMPY_THRESHOLD)
    if isinstance(numpy_threshold, bool) or not isinstance(numpy_threshold, int):
        raise TypeError(f"numpy_threshold must be an int >= 0, got {numpy_threshold!r}")
    if numpy_threshold < 0:
        raise ValueError(f"numpy_threshold must be an int >= 0, got {numpy_threshold!r}")
    return numpy_threshold


def param_key(params: Sequence[torch.Tensor]) -> tuple:
    """What changes when parameters do: version counters (in-place updates) and storage
    pointers (``p.data = new``); a numpy mirror compares it to know it is stale."""
    return (tuple(map(_VERSION, params)), tuple(map(_DATA_PTR, params)))


def _np_elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


#: name -> (torch module factory, numpy function)
ACTIVATIONS: dict[str, tuple[Callable[[], nn.Module], Callable[[np.ndarray], np.ndarray]]] = {
    "tanh": (nn.Tanh, np.tanh),
    "relu": (nn.ReLU, lambda x: np.maximum(x, 0)),
    "elu": (nn.ELU, _np_elu),
    "linear": (nn.Identity, lambda x: x),
}

_NumpyLayers = list[tuple[np.ndarray, np.ndarray]]


def box_in_dim(kind: str, observation_space: gym.Space) -> int:
    """The flattened size of a Box observation space; another space is a TypeError."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise TypeError(
            f"{kind} needs a Box observation space, got {observation_space!r}; "
            "flatten other spaces first (FlattenObservations)"
        )
    return int(np.prod(observation_space.shape))


def init_generator(seed: int | None) -> torch.Generator:
    """The generator of a policy's initial weights: a stream of its own for ``seed``,
    distinct from the sampling generators seeded with ``seed`` (fresh entropy for None)."""
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
    return gen


def linear_shapes(prefix: str, in_dim: int, widths: Iterable[Any], step: int) -> WeightShapes:
    """``(name, shape)`` of the weight and bias of each Linear of an ``nn.Sequential`` whose
    Linears stand every ``step`` modules and have these output ``widths`` (lazily, each
    width checked to be a positive int as it comes)."""
    for i, width in enumerate(widths):
        out = int(width)
        if out <= 0:
            raise ValueError(f"layer sizes must be positive, got {width!r}")
        yield f"{prefix}.{i * step}.weight", (out, in_dim)
        yield f"{prefix}.{i * step}.bias", (out,)
        in_dim = out


def _mlp(in_dim: int, hiddens: Sequence[int], out_dim: int, activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hiddens:
        layers += [nn.Linear(in_dim, h), ACTIVATIONS[activation][0]()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class MLPModel(nn.Module):
    """Flattens obs (B, *shape) -> (B, in_dim), then an MLP to ``out_dim`` outputs.

    With ``vf_head=True`` a separate MLP of the same sizes gives a value per row and
    ``forward`` returns ``(dist_inputs, value)``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hiddens: Sequence[int] = (64, 64),
        activation: str = "tanh",
        vf_head: bool = False,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.pi = _mlp(in_dim, hiddens, out_dim, activation)
        self.vf = _mlp(in_dim, hiddens, 1, activation) if vf_head else None

    def init_weights(self, generator: torch.Generator) -> None:
        """Orthogonal init (gain sqrt(2) hidden, 0.01 policy output, 1 value output)."""
        for net, out_gain in ((self.pi, 0.01), (self.vf, 1.0)):
            if net is None:
                continue
            linears = [m for m in net if isinstance(m, nn.Linear)]
            for i, lin in enumerate(linears):
                gain = out_gain if i == len(linears) - 1 else 2**0.5
                nn.init.orthogonal_(lin.weight, gain=gain, generator=generator)
                nn.init.zeros_(lin.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, *shape) -> dist_inputs (B, out_dim) [, value (B,)]."""
        x = obs.reshape(obs.shape[0], self.in_dim)  # not -1: a batch may have 0 rows
        out = self.pi(x)
        if self.vf is None:
            return out
        return out, self.vf(x)[:, 0]


def _numpy_layers(net: nn.Sequential) -> _NumpyLayers:
    """Float32 copies (W^T, b) of every Linear in ``net``, contiguous for ``x @ W^T``."""
    return [
        (
            np.ascontiguousarray(m.weight.detach().cpu().numpy().T, dtype=np.float32),
            m.bias.detach().cpu().numpy().astype(np.float32),
        )
        for m in net
        if isinstance(m, nn.Linear)
    ]


def _numpy_forward(
    layers: _NumpyLayers, x: np.ndarray, act: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        x = x @ w
        x += b
        if i != last:
            x = act(x)
    return x


class MLPPolicy(TorchPolicy):
    """A :class:`TorchPolicy` over :class:`MLPModel`; the default policy of rlconnect.

    The observation space must be a Box (observations are flattened); the output size comes
    from the action space (Discrete, MultiDiscrete or Box; see :class:`TorchPolicy`).
    Batches of at most ``numpy_threshold`` rows (default 4096, 0 disables; measured here, a
    numpy 64x64 MLP beats torch on one CPU thread up to >= 1024 rows) run in numpy with
    float32 copies of the same weights and sample with ``self.np_random``; they give the same
    ``action_dist_inputs`` / ``action_logp`` / ``vf_preds`` as the torch path (to float32
    rounding). Weights are initialized from ``seed`` (orthogonal), so a seed fixes both the
    initial weights and the sampling.

    >>> import gymnasium as gym, numpy as np
    >>> p = MLPPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), seed=0)
    >>> actions, _, extra = p.compute_actions({"obs": np.zeros((3, 4), np.float32)})
    >>> actions.dtype, sorted(extra)
    (dtype('int64'), ['action_dist_inputs', 'action_logp'])
    >>> rebuilt = MLPPolicy(p.observation_space, p.action_space, **p.get_config())

    Tensor observations (the tensor path) give tensors on their device:

    >>> import torch
    >>> actions, _, extra = p.compute_actions({"obs": torch.zeros((3, 4))})
    >>> actions.dtype, extra["action_logp"].dtype, actions.device.type
    (torch.int64, torch.float32, 'cpu')

    Args:
        observation_space: a Box.
        action_space: Discrete, MultiDiscrete or Box.
        config: free-form options; ``numpy_threshold`` is read from it.
        hiddens: hidden layer sizes.
        activation: one of ``tanh``, ``relu``, ``elu``, ``linear``.
        vf_head: add a separate value MLP; its output is the ``vf_preds`` fetch.
        numpy_threshold: overrides ``config["numpy_threshold"]`` when given.
        seed: seeds the weight init and both generators.
        device: where the model runs (see :class:`TorchPolicy`; not saved in the spec).
            Tensor observations always take torch (the numpy mirror serves numpy input
            on the CPU only).
    """

    model: MLPModel  # narrows TorchPolicy.model: the numpy mirror reads its heads

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: dict | None = None,
        *,
        hiddens: Sequence[int] = (64, 64),
        activation: str = "tanh",
        vf_head: bool = False,
        numpy_threshold: int | None = None,
        seed: int | None = None,
        device: DeviceLike = None,
    ) -> None:
        in_dim = box_in_dim("MLPPolicy", observation_space)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        hiddens = [int(h) for h in hiddens]
        if any(h <= 0 for h in hiddens):
            raise ValueError(f"hiddens must be positive layer sizes, got {hiddens}")
        config = dict(config or {})
        numpy_threshold = config["numpy_threshold"] = numpy_threshold_of(config, numpy_threshold)
        self.hiddens = hiddens
        self.activation = activation
        self.vf_head = bool(vf_head)
        self.numpy_threshold = numpy_threshold
        self.in_dim = in_dim
        out_dim = ActionDistSpec(action_space).width
        model = MLPModel(self.in_dim, out_dim, hiddens, activation, self.vf_head)
        seed = check_seed(seed)
        model.init_weights(init_generator(seed))
        super().__init__(model, observation_space, action_space, config, seed=seed, device=device)
        self._np_act = ACTIVATIONS[activation][1]
        self._params = list(self.model.parameters())
        self._param_key: tuple = ()
        self._np_pi: _NumpyLayers = []
        self._np_vf: _NumpyLayers | None = None
        self._on_weights_changed()

    @staticmethod
    def _shapes_of_arguments(arguments: Mapping[str, Any]) -> WeightShapes:
        """``MLPModel``'s weights for these constructor arguments, without building it
        (see ``Policy.weight_shapes``)."""
        in_dim = box_in_dim("MLPPolicy", arguments["observation_space"])
        out_dim = ActionDistSpec(arguments["action_space"]).width
        heads = [("pi", out_dim)] + ([("vf", 1)] if arguments["vf_head"] else [])
        return (
            pair
            for name, width in heads
            for pair in linear_shapes(
                name, in_dim, itertools.chain(arguments["hiddens"], [width]), 2
            )
        )

    # -- numpy mirror ----------------------------------------------------------------------

    def sync_numpy_weights(self) -> None:
        """Refresh the numpy copies from the torch parameters (automatic in most cases)."""
        self._param_key = param_key(self._params)
        self._np_pi = _numpy_layers(self.model.pi)
        self._np_vf = _numpy_layers(self.model.vf) if self.model.vf is not None else None

    def _on_weights_changed(self) -> None:
        """Refresh the mirror of a CPU policy now; a policy on another device never runs
        in numpy, so its mirror is only marked stale (refreshed if it moves to the CPU)."""
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
        return self._compute_actions_numpy(obs, b, explore)

    def compute_values(self, input_batch: Mapping[str, Any]) -> Any:
        """The value head's output (B,) float32, on the same path (numpy or torch) that
        :meth:`compute_actions` takes for a batch of this size, so it equals ``vf_preds``
        (a tensor on ``obs``'s device for tensor ``obs``).

        Raises:
            NotImplementedError: the policy was built without ``vf_head=True``.
        """
        if not self.vf_head:
            raise NotImplementedError(self._no_value_head())
        obs = input_batch["obs"]
        b = len(obs)
        if not self._numpy_serves(obs, b, self.numpy_threshold):
            return super().compute_values(input_batch)
        x = self._numpy_input(obs, b)
        return _numpy_forward(cast(_NumpyLayers, self._np_vf), x, self._np_act)[:, 0]

    def _numpy_input(self, obs: Any, b: int) -> np.ndarray:
        """``obs`` as float32 ``(b, in_dim)``, the numpy weights refreshed if stale."""
        if param_key(self._params) != self._param_key:
            self.sync_numpy_weights()
        x = np.asarray(obs, dtype=np.float32).reshape(b, -1)
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"obs rows have {x.shape[1]} elements, expected {self.in_dim} "
                f"(observation space {self.observation_space})"
            )
        return x

    def _compute_actions_numpy(self, obs: Any, b: int, explore: bool) -> PolicyOutput:
        x = self._numpy_input(obs, b)
        dist_inputs = _numpy_forward(self._np_pi, x, self._np_act)
        raw, extra = self._sample_numpy(dist_inputs, explore)
        if self._np_vf is not None:
            extra["vf_preds"] = _numpy_forward(self._np_vf, x, self._np_act)[:, 0]
        return self.dist.to_env_actions(raw), [], extra

    def get_config(self) -> dict[str, Any]:
        """Kwargs that rebuild this policy: ``MLPPolicy(obs_space, act_space, **cfg)``."""
        return {
            **super().get_config(),
            "hiddens": list(self.hiddens),
            "activation": self.activation,
            "vf_head": self.vf_head,
            "numpy_threshold": self.numpy_threshold,
        }
