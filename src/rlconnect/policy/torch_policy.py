"""TorchPolicy: wraps a ``torch.nn.Module`` that maps observations to distribution inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlconnect.policy.base import Policy, PolicyOutput, batch_size, validate_weights
from rlconnect.policy.distributions import ActionDistSpec

__all__ = ["TorchPolicy", "as_device", "to_float_tensor"]

#: what ``device=`` takes: a device string ("cpu", "cuda:0"), a ``torch.device``, or None
DeviceLike = str | torch.device | None


def as_device(device: DeviceLike, owner: str = "TorchPolicy") -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None).

    Raises:
        TypeError / ValueError: naming ``owner`` and what ``device=`` takes.
    """
    if device is None or isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(
            f"{owner}: device must be a str such as 'cpu' or 'cuda:0', a torch.device or "
            f"None, got {device!r}"
        )
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(
            f"{owner}: device={device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:0')"
        ) from err


def to_float_tensor(x: Any, device: torch.device | None = None) -> torch.Tensor:
    """A float32 tensor view of ``x``: no copy when it is a writable, contiguous float32 array."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    if not arr.flags.writeable:  # torch.from_numpy warns on read-only arrays
        arr = arr.copy()
    t = torch.from_numpy(arr)
    return t if device is None or device.type == "cpu" else t.to(device)


def quiet_tensor(value: Any) -> torch.Tensor:
    """``value`` as a tensor without torch's "NumPy array is not writable" warning: a
    tensor as it is, a writable array as a view, a read-only one (what Ray's object store
    and memory-mapped files hand out) copied once."""
    if isinstance(value, torch.Tensor):
        return value
    arr = np.asarray(value)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.as_tensor(arr)


def _to_numpy_f32(t: torch.Tensor) -> np.ndarray:
    """A float32 numpy array of ``t`` (no copy for a CPU float32 tensor)."""
    if t.dtype != torch.float32:
        t = t.to(torch.float32)
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()


def _model_input(x: Any, device: torch.device) -> torch.Tensor:
    """A column as the model takes it: float32 on ``device`` (a tensor moved and cast at
    most once, an array through :func:`to_float_tensor`)."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=torch.float32)
    return to_float_tensor(x, device)


class TorchPolicy(Policy):
    """A policy around a torch model that outputs action-distribution inputs.

    Model protocol:

    - Non-recurrent: ``model(obs) -> dist_inputs`` or ``-> (dist_inputs, value)``.
    - Recurrent: the model defines ``get_initial_state() -> list[torch.Tensor]`` (unbatched,
      one per state tensor) and is called ``model(obs, state) -> (dist_inputs, state_out)``
      or ``-> (dist_inputs, state_out, value)``, with ``state`` / ``state_out`` lists of
      (B, *state_shape) tensors.

    ``obs`` is a float32 tensor (B, *obs_shape) on the policy's device, made with
    ``torch.from_numpy`` (no copy for float32 contiguous input). ``dist_inputs`` is
    (B, width): logits (B, n) for ``Discrete(n)``, the concatenated logits of each component
    (B, sum(nvec)) for ``MultiDiscrete``, mean and log-std (B, 2 * d) for a d-element
    ``Box`` (see :mod:`rlconnect.policy.distributions`). ``value`` is (B,) or (B, 1).

    :meth:`compute_actions` reads ``obs`` and, for recurrent models, ``state_in_0 ...``;
    returns actions (Discrete/MultiDiscrete: int64 with ``start`` added; Box: float32 of the
    Box's shape, neither clipped nor squashed), state-outs (B, *state_shape), and the extra
    fetches ``action_logp`` (B,) float32 (log-prob of the returned action, for
    ``explore=False`` too), ``action_dist_inputs`` (B, width) float32 and, when the model
    returns a value, ``vf_preds`` (B,) float32.

    **Numpy in, numpy out.** Everything runs under ``torch.inference_mode()``. Sampling of
    CPU batches up to ``numpy_sampling_rows`` rows runs in numpy on the model's output with
    ``self.np_random`` (one numpy call costs a fraction of a torch op, and sampling is ~10
    ops); larger or GPU batches sample in torch with ``self.torch_random``. Both give the
    same distribution and the same log-probabilities.

    **Tensors in, tensors out** (the tensor path of batched simulators). When ``obs`` is a
    torch tensor, every output above is a torch tensor of the same dtype and shape as on
    the numpy path, on ``obs``'s device; ``state_in_*`` are then tensors too. Sampling runs
    in torch with ``self.torch_random`` on the policy's device, without any read of a
    tensor by the host. A policy on another device than its inputs moves each input there
    once and each output back once (one transfer each way per column: keep the policy on
    the env's device to avoid them). This path runs under ``torch.no_grad()``, not
    inference mode, so its outputs are ordinary tensors that later in-place updates (a
    state buffer, a connector) and a learner's autograd accept.

    ``device`` is where the model runs in this process, not part of :meth:`get_config`: a
    checkpoint written by a policy on a GPU rebuilds on a CPU-only machine (the model on
    the CPU), and whoever rebuilds it chooses its device (``device=`` or :meth:`to`).
    Override :meth:`forward` to feed a model other columns (e.g. ``prev_actions``).

    Args:
        model: the ``torch.nn.Module``.
        observation_space, action_space, config, seed: as for :class:`Policy`.
        device: move the model there (a str such as ``"cuda:0"`` or a ``torch.device``);
            None keeps it where it is (the device of its first parameter, else the CPU).

    Raises:
        TypeError: if the action space is not Discrete, MultiDiscrete or Box.
        ValueError: ``device`` is no torch device, or one this machine does not have.
    """

    numpy_sampling_rows = 4096
    """CPU batches up to this many rows sample in numpy (0: always in torch)."""

    def __init__(
        self,
        model: torch.nn.Module,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: dict | None = None,
        *,
        seed: int | None = None,
        device: DeviceLike = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model)}")
        self.dist = ActionDistSpec(action_space)
        self.model = model
        self._place(as_device(device, type(self).__name__))
        super().__init__(observation_space, action_space, config, seed=seed)
        self.model.eval()
        get_initial_state = getattr(model, "get_initial_state", None)
        init = get_initial_state() if callable(get_initial_state) else []
        self._initial_state = [np.asarray(s.detach().cpu().numpy()) for s in init]

    def to(self, device: DeviceLike) -> TorchPolicy:
        """Move the model to ``device`` and return the policy (in place, like ``Module.to``).

        ``self.torch_random`` becomes a generator on the new device, seeded again from
        ``seed`` (a generator's state does not carry across device types), so the torch
        draws after a move restart from the seed; ``np_random`` is kept.

        Raises:
            ValueError: as for ``device=`` at construction.
        """
        target = as_device(device, type(self).__name__)
        if target is None:
            raise TypeError(f"{type(self).__name__}.to needs a device such as 'cpu', got None")
        self._place(target)
        self._seed_torch()
        self._on_weights_changed()
        return self

    def _place(self, target: torch.device | None) -> None:
        """Move the model to ``target`` (None: leave it) and set ``device`` and a fresh,
        unseeded ``torch_random`` there.

        Raises:
            ValueError: the device does not exist here, naming it and what to pass instead.
        """
        try:
            if target is not None:
                self.model.to(target)
            first = next(iter(self.model.parameters()), None)
            self.device = first.device if first is not None else (target or torch.device("cpu"))
            self.torch_random = torch.Generator(device=self.device)
        except (RuntimeError, AssertionError) as err:  # torch's words for a missing device
            have = "'cpu'" + (", 'cuda:0'" if torch.cuda.is_available() else "")
            raise ValueError(
                f"{type(self).__name__}: cannot run on device {str(target)!r} here ({err}); "
                f"pass a device this machine has ({have}), or device=None"
            ) from err

    # -- seeding -------------------------------------------------------------------------

    def seed(self, seed: int | None = None) -> None:
        """Re-seed both the numpy and the torch generator."""
        super().seed(seed)
        self._seed_torch()

    def _seed_torch(self) -> None:
        if self._seed is None:
            self.torch_random.seed()
        else:
            self.torch_random.manual_seed(self._seed)

    # -- inference -----------------------------------------------------------------------

    def get_initial_state(self) -> list[np.ndarray]:
        """Copies of the model's initial state (unbatched numpy); [] if not recurrent."""
        return [s.copy() for s in self._initial_state]

    def is_recurrent(self) -> bool:
        """True if the model defines a non-empty ``get_initial_state()``."""
        return bool(self._initial_state)

    def num_state_tensors(self) -> int:
        """How many ``state_in_*`` columns :meth:`compute_actions` expects."""
        return len(self._initial_state)

    def _state_columns(self, input_batch: Mapping[str, Any]) -> list[Any]:
        n = len(self._initial_state)
        names = [f"state_in_{i}" for i in range(n)]
        missing = [k for k in names if k not in input_batch]
        if missing:
            raise KeyError(
                f"recurrent {type(self).__name__} needs columns {names}; missing {missing} "
                f"(start from get_initial_state(), feed back the previous state_outs)"
            )
        return [input_batch[k] for k in names]

    def forward(
        self, input_batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        """Run the model on a batch; returns (dist_inputs, state_outs, value or None).

        Called without gradients, with ``obs`` and ``state_in_*`` as numpy arrays or as
        tensors on any device (both become float32 tensors on the policy's device).
        Subclasses may override it to pass more columns to their model.
        """
        obs = _model_input(input_batch["obs"], self.device)
        if not self._initial_state:
            out = self.model(obs)
            if isinstance(out, tuple):
                return out[0], [], out[1]
            return out, [], None
        state = [_model_input(s, self.device) for s in self._state_columns(input_batch)]
        out = self.model(obs, state)
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise TypeError(
                "a recurrent model must return (dist_inputs, state_out) or "
                f"(dist_inputs, state_out, value), got {type(out)}"
            )
        return out[0], list(out[1]), out[2] if len(out) == 3 else None

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> PolicyOutput:
        """Compute actions for B rows (see the class docstring for columns and outputs)."""
        obs = _obs_column(input_batch)
        if isinstance(obs, torch.Tensor):
            return self._compute_actions_tensor(input_batch, obs, explore)
        b = batch_size(input_batch)
        with torch.inference_mode():
            dist_inputs, state_outs, value = self.forward(input_batch)
            self.dist.check_inputs(dist_inputs.shape, b)
            if b <= self.numpy_sampling_rows and dist_inputs.device.type == "cpu":
                raw_np, extra = self._sample_numpy(_to_numpy_f32(dist_inputs), explore)
            else:
                raw, logp = self.dist.sample_torch(dist_inputs, explore, self.torch_random)
                raw_np = raw.cpu().numpy()
                extra = {
                    "action_logp": _to_numpy_f32(logp),
                    "action_dist_inputs": _to_numpy_f32(dist_inputs),
                }
            if value is not None:
                extra["vf_preds"] = _to_numpy_f32(value.reshape(b))
            actions = self.dist.to_env_actions(raw_np)
            states = [s.cpu().numpy() for s in state_outs]
        return actions, states, extra

    def _compute_actions_tensor(
        self, input_batch: Mapping[str, Any], obs: torch.Tensor, explore: bool
    ) -> PolicyOutput:
        """The tensor path: one forward pass and torch sampling on the policy's device, no
        host read; outputs on ``obs``'s device (one move each when that differs)."""
        b = obs.shape[0]
        with torch.no_grad():
            dist_inputs, state_outs, value = self.forward(input_batch)
            self.dist.check_inputs(dist_inputs.shape, b)
            dist_inputs = dist_inputs.to(torch.float32)
            raw, logp = self.dist.sample_torch(dist_inputs, explore, self.torch_random)
            extra = {"action_logp": logp.to(torch.float32), "action_dist_inputs": dist_inputs}
            if value is not None:
                extra["vf_preds"] = value.reshape(b).to(torch.float32)
            actions = self.dist.to_env_actions_torch(raw)
        home = obs.device
        if dist_inputs.device != home:
            actions = actions.to(home)
            state_outs = [s.to(home) for s in state_outs]
            extra = {k: v.to(home) for k, v in extra.items()}
        return actions, state_outs, extra

    def compute_values(self, input_batch: Mapping[str, Any]) -> Any:
        """State values (B,) float32 of the model's value output (:meth:`Policy.compute_values`):
        numpy for numpy input, a tensor on ``obs``'s device for tensor input.

        Raises:
            NotImplementedError: the model returns no value (no value head).
        """
        obs = _obs_column(input_batch)
        if isinstance(obs, torch.Tensor):
            with torch.no_grad():
                _, _, value = self.forward(input_batch)
            if value is None:
                raise NotImplementedError(self._no_value_head())
            return value.reshape(obs.shape[0]).to(device=obs.device, dtype=torch.float32)
        b = batch_size(input_batch)
        with torch.inference_mode():
            _, _, value = self.forward(input_batch)
        if value is None:
            raise NotImplementedError(self._no_value_head())
        return _to_numpy_f32(value.reshape(b))

    def _numpy_serves(self, obs: Any, rows: int, threshold: int) -> bool:
        """Whether a subclass's numpy mirror of the model serves these rows: a numpy batch
        of 1..``threshold`` rows on a CPU policy (tensor input always takes torch)."""
        return (
            0 < rows <= threshold
            and self.device.type == "cpu"
            and not isinstance(obs, torch.Tensor)
        )

    def _no_value_head(self) -> str:
        return (
            f"{type(self).__name__} has no value head: compute_values needs a model that "
            "returns (dist_inputs, values) (MLPPolicy / LSTMPolicy: build with vf_head=True)"
        )

    def compute_log_likelihoods(self, input_batch: Mapping[str, Any], actions: Any) -> Any:
        """Log-probabilities (B,) float32 of env ``actions`` under the distribution of the
        recomputed ``action_dist_inputs`` (see :meth:`Policy.compute_log_likelihoods`):
        numpy for numpy ``obs``, a tensor on ``obs``'s device for tensor ``obs``."""
        obs = _obs_column(input_batch)
        on_tensors = isinstance(obs, torch.Tensor)
        b = obs.shape[0] if on_tensors else batch_size(input_batch)
        with torch.no_grad() if on_tensors else torch.inference_mode():
            dist_inputs, _, _ = self.forward(input_batch)
            self.dist.check_inputs(dist_inputs.shape, b)
            acts = quiet_tensor(actions).to(dist_inputs.device)
            logp = self.dist.logp_torch(dist_inputs.to(torch.float32), acts)
        if on_tensors:
            return logp.to(device=obs.device, dtype=torch.float32)
        return _to_numpy_f32(logp)

    def _sample_numpy(
        self, dist_inputs: np.ndarray, explore: bool
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample float32 distribution inputs with ``self.np_random``: (raw actions, the
        ``action_logp`` and ``action_dist_inputs`` fetches)."""
        raw, logp = self.dist.sample_numpy(dist_inputs, explore, self.np_random)
        return raw, {
            "action_logp": logp.astype(np.float32, copy=False),
            "action_dist_inputs": dist_inputs,
        }

    # -- weights -------------------------------------------------------------------------

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the model's ``state_dict`` as numpy arrays, keyed by its names (on the
        host, whatever the policy's device)."""
        return {k: _host_copy(v.detach()) for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Copy ``weights`` (numpy arrays, read-only ones included, or tensors on any
        device) into the model in place, on its device; names and shapes must match
        exactly.

        Raises:
            ValueError: naming missing, unexpected and mis-shaped entries; nothing is
                changed then.
        """
        state = self.model.state_dict()
        validate_weights(
            {k: tuple(v.shape) for k, v in state.items()}, weights, type(self).__name__
        )
        with torch.no_grad():
            for name, target in state.items():
                target.copy_(quiet_tensor(weights[name]))
        self._on_weights_changed()

    def _on_weights_changed(self) -> None:
        """Hook for subclasses that cache derived copies of the weights."""

    def get_config(self) -> dict[str, Any]:
        """Constructor kwargs besides the model and spaces (the model itself is not JSON;
        ``device`` is left out so that the spec rebuilds on any machine)."""
        return super().get_config()


def _host_copy(t: torch.Tensor) -> np.ndarray:
    """A numpy copy of ``t`` that shares nothing with it (one copy from any device)."""
    return t.numpy().copy() if t.device.type == "cpu" else t.cpu().numpy()


def _obs_column(input_batch: Mapping[str, Any]) -> Any:
    """``input_batch["obs"]``, or a KeyError naming the columns there are."""
    try:
        return input_batch["obs"]
    except KeyError:
        raise KeyError(
            f"compute_actions needs an 'obs' column; got columns {sorted(input_batch)}"
        ) from None
