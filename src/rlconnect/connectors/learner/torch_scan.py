"""The learner scans on torch tensors, on the batch's device, with no host read.

The numpy path runs each scan as one compiled pass (:mod:`.scan`, numba) that walks the
rows one by one; a device cannot do that, so here every scan is a short Python loop of
whole-tensor operations, the same on a CPU or a GPU:

- :func:`reverse_linear_scan`: ``y[t] = x[t] + coef[t] * y[t+1]``, where ``coef`` is 0 on
  each trajectory's last row (so nothing flows across trajectories). On a batch laid out
  as ``N`` sub-envs of ``T`` rows each (``batch.meta["rows_per_env"] = T``, the runner's
  tensor batches) it is ``T`` steps over ``[N]`` columns of a ``[T, N]`` copy; on any
  other batch it is a segmented scan by recursive doubling (Hillis and Steele): ``ceil(
  log2(rows))`` steps over the whole batch, each adding the partial sum ``d`` rows on
  with the product of the ``d`` coefficients in between.
- :func:`window_sum`: ``sum_{i < n} discount**i * x[t+i]`` within the trajectory, one
  step per window position (at most ``n`` and at most ``T``, or the batch's rows).

Sums run in float64 (float32 on devices without it, such as Apple's ``mps``), as the
compiled passes do; the order of the additions differs from a sequential loop's in the
general case, which float64 makes invisible in float32 outputs.
"""

from __future__ import annotations

import torch

__all__ = ["compute_dtype", "reverse_linear_scan", "window_sum"]


def compute_dtype(device: torch.device) -> torch.dtype:
    """The dtype the scans sum in on ``device``: float64, or float32 where the device has
    no float64 (``mps``)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _fixed_scan(x: torch.Tensor, coef: torch.Tensor, rows_per_env: int) -> torch.Tensor:
    """The scan over ``N`` blocks of ``T = rows_per_env`` rows: ``T`` steps of ``[N]``
    operations from the last column back (``coef`` is 0 on each block's last row)."""
    steps = rows_per_env
    xt = x.view(-1, steps).t().contiguous()  # [T, N]: each step reads contiguous memory
    ct = coef.view(-1, steps).t().contiguous()
    out = torch.empty_like(xt)
    out[steps - 1] = xt[steps - 1]
    for t in range(steps - 2, -1, -1):
        torch.addcmul(xt[t], ct[t], out[t + 1], out=out[t])
    return out.t().reshape(-1)


def _doubling_scan(x: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """The scan over any batch by recursive doubling: after the step with offset ``d``,
    ``y[t]`` holds ``x[t] + ... `` over the next ``2d`` rows (stopped at a 0 coefficient)
    and ``c[t]`` the product of the ``2d`` coefficients from ``t`` on."""
    y, c = x.clone(), coef.clone()
    rows, d = len(x), 1
    while d < rows:
        y[:-d] = torch.addcmul(y[:-d], c[:-d], y[d:])  # the right side is read first
        c[:-d] = c[:-d] * c[d:]
        d *= 2
    return y


def reverse_linear_scan(
    x: torch.Tensor, coef: torch.Tensor, rows_per_env: int | None
) -> torch.Tensor:
    """``y[t] = x[t] + coef[t] * y[t+1]`` (``y`` after the batch's last row: 0), a new
    tensor of ``x``'s dtype. ``coef`` must be 0 on the last row of every trajectory (and,
    with ``rows_per_env``, on the last row of every block of that many rows)."""
    if not len(x):
        return x.clone()
    if rows_per_env:
        return _fixed_scan(x, coef, rows_per_env)
    return _doubling_scan(x, coef)


def window_sum(
    x: torch.Tensor, same_next: torch.Tensor, discount: float, n: int, longest: int
) -> torch.Tensor:
    """``y[t] = sum_{i < k} discount**i * x[t+i]`` where ``k`` is ``n`` or fewer: the
    window stops after the row of ``t``'s trajectory where ``same_next`` (row ``t+1`` is in
    the same trajectory) is False. ``longest`` bounds a trajectory's rows (``T``, or the
    batch's rows): the loop makes ``min(n, longest) - 1`` whole-tensor steps."""
    y = x.clone()
    alive = same_next.clone()
    for i in range(1, min(n, longest)):
        term = torch.where(alive[:-i], x[i:], 0.0)
        y[:-i] += term * (float(discount) ** i)
        alive[:-i] &= same_next[i:]
    return y
