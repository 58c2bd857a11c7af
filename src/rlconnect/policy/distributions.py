"""Action distributions without ``torch.distributions`` objects (they are slow per call).

An :class:`ActionDistSpec` is built once from the action space and then samples (or takes
the mode of) a batch of distribution inputs, either as torch tensors with a
``torch.Generator`` or as numpy arrays with a ``np.random.Generator``. Both return the
action *indices/values* (before the Discrete ``start`` offset) and the log-probability of
the returned action (B,).

Layouts of the distribution inputs (one row per action):

- ``Discrete(n)``: logits (n,); categorical.
- ``MultiDiscrete(nvec)``: the logits of each component concatenated (sum(nvec),), one
  independent categorical per component; ``logp`` is their sum.
- ``Box(shape)``: mean and log-std concatenated (2 * prod(shape),); diagonal Gaussian;
  ``logp`` sums over the dimensions. No clipping or squashing (action connectors do that).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

__all__ = ["SUPPORTED_ACTION_SPACES", "ActionDistSpec"]

SUPPORTED_ACTION_SPACES = "Discrete, MultiDiscrete and Box"
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_ROWS = np.arange(1024)


_PY_CATEGORICAL_MAX = 32  # logits up to this size sample in plain Python (numpy calls cost ~1 us)


def _py_categorical(
    logits: np.ndarray, explore: bool, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_np_categorical` for a handful of logits, on Python floats: the same draws
    from ``rng`` (one uniform per row) and the same rule, in a fraction of the calls."""
    rows = logits.tolist()
    us = rng.random(len(rows)).tolist() if explore else None
    exp, log = math.exp, math.log
    acts, logps = [], []
    for i, row in enumerate(rows):
        m = max(row)
        exps = [exp(v - m) for v in row]
        total = sum(exps)
        if us is None:
            a = row.index(m)
        else:
            u, c, a = us[i] * total, 0.0, len(row) - 1
            for j, e in enumerate(exps):
                c += e
                if c > u:  # first bin whose CDF exceeds u
                    a = j
                    break
        acts.append(a)
        logps.append(row[a] - m - log(total))
    return np.array(acts, dtype=np.int64), np.array(logps, dtype=np.float32)


def _np_categorical(
    logits: np.ndarray, explore: bool, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-CDF categorical sampling (one uniform per row) or argmax; returns (a, logp).

    Written for small batches, where each numpy call costs ~1 us: few reductions, ufunc
    methods instead of their wrappers, no ``keepdims`` or ``take_along_axis``; the smallest
    go to :func:`_py_categorical`.
    """
    if logits.size <= _PY_CATEGORICAL_MAX:
        return _py_categorical(logits, explore, rng)
    b = len(logits)
    z = logits - logits.max(axis=1)[:, None]
    cdf = np.add.accumulate(np.exp(z), axis=1)
    total = cdf[:, -1]
    if explore:
        u = rng.random(b) * total
        a = (cdf > u[:, None]).argmax(axis=1)  # first bin whose CDF exceeds u
    else:
        a = z.argmax(axis=1)
    rows = _ROWS[:b] if b <= len(_ROWS) else np.arange(b)
    return a, z[rows, a] - np.log(total)


def _torch_categorical(
    logits: torch.Tensor, explore: bool, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF sampling (one uniform per row) or argmax; returns (a, logp).

    Equivalent in distribution to ``torch.multinomial(softmax(logits), 1)`` and several
    times cheaper per call at small batch sizes, where the call overhead dominates.
    """
    logp_all = torch.log_softmax(logits, dim=1)
    if explore:
        cdf = logp_all.exp().cumsum(dim=1)
        shape = (logits.shape[0], 1)
        u = torch.rand(shape, generator=gen, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
        a = (cdf <= u).sum(dim=1, keepdim=True).clamp_(max=logits.shape[1] - 1)
    else:
        a = logp_all.argmax(dim=1, keepdim=True)
    return a[:, 0], logp_all.gather(1, a)[:, 0]


class ActionDistSpec:
    """How an action space maps to distribution inputs, samples, and log-probabilities.

    Args:
        action_space: Discrete, MultiDiscrete or Box.

    Raises:
        TypeError: for any other space, naming it and the supported ones.
    """

    def __init__(self, action_space: gym.Space) -> None:
        self.action_space = action_space
        self.start: np.ndarray | int = 0
        self.nvec: list[int] = []
        if isinstance(action_space, gym.spaces.Discrete):
            self.kind = "categorical"
            self.width = int(action_space.n)
            self.start = int(action_space.start)
            self.action_shape: tuple[int, ...] = ()
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self.kind = "multi_categorical"
            self.nvec = [int(n) for n in np.asarray(action_space.nvec).reshape(-1)]
            self.width = sum(self.nvec)
            start = np.asarray(action_space.start, dtype=np.int64)
            self.start = start if start.any() else 0
            self.action_shape = tuple(action_space.shape)
        elif isinstance(action_space, gym.spaces.Box):
            self.kind = "gaussian"
            self.dim = int(np.prod(action_space.shape))
            self.width = 2 * self.dim
            self.action_shape = tuple(action_space.shape)
        else:
            raise TypeError(
                f"unsupported action space {action_space!r}: TorchPolicy/MLPPolicy support "
                f"{SUPPORTED_ACTION_SPACES} (wrap other spaces in an action connector)"
            )
        self._uniform_nvec = len(set(self.nvec)) == 1
        self._starts: dict[torch.device, torch.Tensor] = {}

    def check_inputs(self, dist_inputs_shape: tuple[int, ...], batch: int) -> None:
        """Raise ValueError if the model output is not (batch, width)."""
        if tuple(dist_inputs_shape) != (batch, self.width):
            raise ValueError(
                f"the model returned distribution inputs of shape {tuple(dist_inputs_shape)}, "
                f"expected ({batch}, {self.width}) for action space {self.action_space}"
            )

    # -- torch ---------------------------------------------------------------------------

    def _start_on(self, device: torch.device) -> torch.Tensor:
        """``start`` as an int64 tensor on ``device``, made once per device (a copy to a
        device each call would cost a transfer)."""
        start = self._starts.get(device)
        if start is None:
            start = self._starts[device] = torch.as_tensor(self.start, dtype=torch.int64).to(device)
        return start

    def to_env_actions_torch(self, raw: torch.Tensor) -> torch.Tensor:
        """:meth:`to_env_actions` on tensors, on ``raw``'s device: int64 with ``start``
        added for Discrete / MultiDiscrete, float32 of the Box's shape."""
        b = raw.shape[0]
        if self.kind == "gaussian":
            return raw.reshape(b, *self.action_shape).to(torch.float32)
        out = raw.to(torch.int64)
        if self.kind == "multi_categorical":
            out = out.reshape(b, *self.action_shape)
        if isinstance(self.start, np.ndarray):
            return out + self._start_on(out.device).reshape(self.action_shape)
        return out + self.start if self.start else out

    def sample_torch(
        self, dist_inputs: torch.Tensor, explore: bool, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample (or take the mode); returns (raw actions (B, ...), logp (B,))."""
        if self.kind == "categorical":
            return _torch_categorical(dist_inputs, explore, gen)
        if self.kind == "multi_categorical":
            b = dist_inputs.shape[0]
            if self._uniform_nvec:
                k, n = len(self.nvec), self.nvec[0]
                a, logp = _torch_categorical(dist_inputs.reshape(b * k, n), explore, gen)
                return a.reshape(b, k), logp.reshape(b, k).sum(dim=1)
            outs = [
                _torch_categorical(part, explore, gen)
                for part in torch.split(dist_inputs, self.nvec, dim=1)
            ]
            return torch.stack([o[0] for o in outs], 1), torch.stack([o[1] for o in outs], 1).sum(1)
        mean, log_std = dist_inputs[:, : self.dim], dist_inputs[:, self.dim :]
        if explore:
            noise = torch.randn(mean.shape, generator=gen, dtype=mean.dtype, device=mean.device)
            a = mean + log_std.exp() * noise
            logp = (-0.5 * noise.square() - log_std).sum(dim=1) - self.dim * _HALF_LOG_2PI
        else:
            a = mean.clone()  # own storage: clipping actions in place keeps the inputs
            logp = -log_std.sum(dim=1) - self.dim * _HALF_LOG_2PI
        return a, logp

    def logp_torch(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Log-probability (B,) of given env actions (with ``start`` offsets), differentiable."""
        b = dist_inputs.shape[0]
        if self.kind == "categorical":
            idx = (actions.reshape(b).long() - int(self.start))[:, None]  # Discrete: an int
            return torch.log_softmax(dist_inputs, dim=1).gather(1, idx)[:, 0]
        if self.kind == "multi_categorical":
            idx = actions.reshape(b, -1).long() - self._start_on(actions.device).reshape(-1)
            parts = torch.split(dist_inputs, self.nvec, dim=1)
            return sum(
                (
                    torch.log_softmax(p, dim=1).gather(1, idx[:, i : i + 1])[:, 0]
                    for i, p in enumerate(parts)
                ),
                dist_inputs.new_zeros(b),
            )
        mean, log_std = dist_inputs[:, : self.dim], dist_inputs[:, self.dim :]
        z = (actions.reshape(b, self.dim).to(mean.dtype) - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std).sum(dim=1) - self.dim * _HALF_LOG_2PI

    # -- numpy ---------------------------------------------------------------------------

    def sample_numpy(
        self, dist_inputs: np.ndarray, explore: bool, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Numpy twin of :meth:`sample_torch` (float32 in, (raw actions, logp) out)."""
        if self.kind == "categorical":
            return _np_categorical(dist_inputs, explore, rng)
        if self.kind == "multi_categorical":
            b = dist_inputs.shape[0]
            if self._uniform_nvec:
                k, n = len(self.nvec), self.nvec[0]
                a, logp = _np_categorical(dist_inputs.reshape(b * k, n), explore, rng)
                return a.reshape(b, k), logp.reshape(b, k).sum(axis=1)
            bounds = np.cumsum(self.nvec)[:-1]
            outs = [_np_categorical(p, explore, rng) for p in np.split(dist_inputs, bounds, 1)]
            return np.stack([o[0] for o in outs], 1), np.stack([o[1] for o in outs], 1).sum(1)
        mean, log_std = dist_inputs[:, : self.dim], dist_inputs[:, self.dim :]
        if explore:
            noise = rng.standard_normal(mean.shape, dtype=np.float32)
            a = mean + np.exp(log_std) * noise
            logp = (-0.5 * noise * noise - log_std).sum(axis=1) - self.dim * _HALF_LOG_2PI
        else:
            a = mean
            logp = -log_std.sum(axis=1) - self.dim * _HALF_LOG_2PI
        return a, logp.astype(np.float32)

    # -- output --------------------------------------------------------------------------

    def to_env_actions(self, raw: np.ndarray) -> np.ndarray:
        """Raw sampled values (B, ...) -> actions in the space's layout.

        Categorical indices become int64 with ``start`` added; Gaussian samples become
        float32 of the Box's shape.
        """
        b = raw.shape[0]
        if self.kind == "gaussian":
            return raw.reshape(b, *self.action_shape).astype(np.float32, copy=False)
        out = raw.astype(np.int64, copy=False)
        if self.kind == "multi_categorical":
            out = out.reshape(b, *self.action_shape)
        if isinstance(self.start, np.ndarray):
            return out + self.start
        return out + self.start if self.start else out
