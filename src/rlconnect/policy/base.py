"""The policy interface: one batched call per step, numpy in and numpy out (or, on the
tensor path of batched simulators, torch tensors in and torch tensors out on the input's
device: ``TorchPolicy``, ``MLPPolicy``, ``LSTMPolicy`` and ``RandomPolicy`` do both).

A policy maps a batch of rows (all agents of one policy that act in this step, across all
sub-environments) to actions. The runner calls it like this::

    batch = {"obs": obs}                             # (B, *obs_shape), agent pipeline output
    for i, s in enumerate(states):                   # recurrent policies only
        batch[f"state_in_{i}"] = s                   # (B, *state_shape_i)
    actions, state_outs, extra = policy.compute_actions(batch, explore=True)
    # actions: (B, *action_shape) numpy (a nest of arrays for Tuple/Dict spaces)
    # state_outs[i]: (B, *state_shape_i), becomes column f"state_out_{i}"
    # extra: e.g. "action_logp" (B,), "action_dist_inputs" (B, n), "vf_preds" (B,)

Every policy owns its random generators, seeded from ``seed``: sampling is deterministic for
a given seed and sequence of calls, and independent of global numpy/torch RNG state.
"""

from __future__ import annotations

import abc
import copy
import functools
import inspect
import numbers
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import gymnasium as gym
import numpy as np
import tree

__all__ = [
    "Policy",
    "PolicyOutput",
    "WeightShapes",
    "check_declared_weights",
    "check_seed",
    "validate_weights",
]

#: ``(actions, state_outs, extra_fetches)`` as returned by :meth:`Policy.compute_actions`:
#: numpy arrays for numpy input, torch tensors for tensor input (the tensor path).
PolicyOutput = tuple[Any, list[Any], dict[str, Any]]
#: ``(name, shape)`` of each weight, in ``get_weights()`` order (see ``Policy.weight_shapes``).
WeightShapes = Iterator[tuple[str, tuple[int, ...]]]


def check_seed(seed: int | None) -> int | None:
    """Return ``seed`` as a plain int (or None); raise if it is not a non-negative integer."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be a non-negative int or None, got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
    return int(seed)


def validate_weights(
    expected: Mapping[str, tuple[int, ...]], weights: Mapping[str, Any], owner: str
) -> None:
    """Check that ``weights`` has exactly the names and shapes of ``expected``.

    Raises:
        ValueError: naming every missing, unexpected and mis-shaped entry.
    """
    if not isinstance(weights, Mapping):
        raise TypeError(f"{owner}.set_weights expects a dict of arrays, got {type(weights)}")
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    misshaped = {
        name: (tuple(np.shape(weights[name])), shape)
        for name, shape in expected.items()
        if name in weights and tuple(np.shape(weights[name])) != tuple(shape)
    }
    if not (missing or unexpected or misshaped):
        return
    parts = []
    if missing:
        parts.append(f"missing entries {missing}")
    if unexpected:
        parts.append(f"unexpected entries {unexpected}")
    if misshaped:
        desc = ", ".join(f"{n!r}: got {g}, expected {e}" for n, (g, e) in misshaped.items())
        parts.append(f"mis-shaped entries {{{desc}}}")
    raise ValueError(f"{owner}.set_weights: " + "; ".join(parts))


def check_declared_weights(
    declared: Iterable[tuple[str, tuple[int, ...]]], weights: Mapping[str, Any], owner: str
) -> None:
    """Check the weights a saved config declares (``Policy.weight_shapes``) against the
    stored ones, before anything is built: the same names, each of the same shape.

    ``declared`` is consumed lazily and no further than the stored weights go, so a config
    declaring a million layers costs no more than the file's own weights.

    Raises:
        ValueError: naming the first difference.
    """
    fail = f"{owner}: the saved config declares weights that differ from the stored ones"
    seen: set[str] = set()
    for name, shape in declared:
        if len(seen) == len(weights):
            raise ValueError(f"{fail}: it declares more than the {len(weights)} stored weights")
        if name not in weights or name in seen:
            raise ValueError(f"{fail}: it declares {name!r}, which the file does not hold")
        stored = tuple(np.shape(weights[name]))
        if tuple(shape) != stored:
            raise ValueError(f"{fail}: {name!r} is declared {tuple(shape)} but stored {stored}")
        seen.add(name)
    missing = [n for n in weights if n not in seen]
    if missing:
        raise ValueError(f"{fail}: the file holds {missing[:3]!r}, which it does not declare")


def batch_size(input_batch: Mapping[str, Any]) -> int:
    """Number of rows of ``input_batch`` (the leading length of its ``obs`` column).

    A batch that knows its row count says so with an int ``num_rows`` attribute (the
    runner's views of some rows of a poll): then no column is read, so a policy that only
    needs the count (``RandomPolicy``) does not make the view copy its observations."""
    rows = getattr(input_batch, "num_rows", None)
    if type(rows) is int:
        return rows
    try:
        obs = input_batch["obs"]
    except KeyError:
        raise KeyError(
            f"compute_actions needs an 'obs' column; got columns {sorted(input_batch)}"
        ) from None
    if isinstance(obs, np.ndarray):
        return int(obs.shape[0])
    leaves = tree.flatten(obs)
    if not leaves:
        raise ValueError("the 'obs' column is an empty nest: cannot tell the batch size")
    return len(leaves[0])


def _counts_versions(set_weights: Callable[..., None]) -> Callable[..., None]:
    """``set_weights`` that makes ``weights_seq`` one more than it was at the call, once
    the weights are loaded. Nested calls (an override calling ``super().set_weights``)
    set the same number, so one outer call is one version."""

    @functools.wraps(set_weights)
    def versioned(self: Policy, weights: Mapping[str, Any]) -> None:
        seq = self.weights_seq
        set_weights(self, weights)
        self.weights_seq = seq + 1

    versioned._counts_versions = True  # type: ignore[attr-defined]
    return versioned


class Policy(abc.ABC):
    """Abstract base of all policies.

    Subclasses implement :meth:`compute_actions`; recurrent ones also
    :meth:`get_initial_state`, and those with parameters :meth:`get_weights` /
    :meth:`set_weights`. Subclasses that own more generators than ``self.np_random``
    extend :meth:`seed`.

    ``weights_seq`` is the version of the weights: 0 at construction, one more after
    every ``set_weights`` (a subclass's override counts too, without doing anything). The
    runner records it with every row (column ``weights_seq``: the weights that chose the
    row's action), so a learner sees how far behind its data is.

    Args:
        observation_space: the space of one row of ``obs`` (the agent pipeline's output).
        action_space: the space of one action.
        config: free-form, JSON-able policy options (copied).
        seed: seeds the policy's own generators; None draws fresh OS entropy.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: dict | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        if not isinstance(observation_space, gym.Space):
            raise TypeError(
                f"observation_space must be a gymnasium Space, got {observation_space!r}"
            )
        if not isinstance(action_space, gym.Space):
            raise TypeError(f"action_space must be a gymnasium Space, got {action_space!r}")
        self.observation_space = observation_space
        self.action_space = action_space
        self.config: dict = dict(config or {})
        self._seed: int | None = None
        self.np_random: np.random.Generator = np.random.default_rng()
        self.seed(seed)

    #: the version of the weights (see the class docstring)
    weights_seq: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("set_weights")
        if callable(own) and not getattr(own, "_counts_versions", False):
            cls.set_weights = _counts_versions(own)  # type: ignore[method-assign]

    # -- inference -----------------------------------------------------------------------

    @abc.abstractmethod
    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> PolicyOutput:
        """Compute one action per row of ``input_batch``.

        Args:
            input_batch: columns with a common leading length B: ``obs`` (B, *obs_shape);
                recurrent policies need ``state_in_0, state_in_1, ...``; may hold
                ``prev_actions`` / ``prev_rewards``.
            explore: sample from the action distribution (True) or take its mode (False).

        Returns:
            ``(actions, state_outs, extra_fetches)``: actions with B rows, a list of
            state-out arrays (B, ...) (empty if not recurrent), and a dict of (B, ...) arrays.
        """

    def compute_values(self, input_batch: Mapping[str, Any]) -> np.ndarray:
        """The state value (B,) float32 of each row of a batch shaped like
        :meth:`compute_actions`' input (``obs``, and ``state_in_*`` for recurrent policies:
        one step from that state). No gradient, no random number drawn; equals the
        ``vf_preds`` the policy records when sampling. Learner connectors (``GAE``,
        ``DiscountedReturns``, ``VTrace``) call it for bootstrap values. For a batch of
        torch tensors (the tensor path) a policy that takes tensors returns a float32
        tensor (B,) on the device of ``obs``.

        Raises:
            NotImplementedError: the policy has no value function (no value head).
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no value function: compute_values needs a policy with "
            "a value head (e.g. MLPPolicy or LSTMPolicy with vf_head=True)"
        )

    def compute_log_likelihoods(self, input_batch: Mapping[str, Any], actions: Any) -> np.ndarray:
        """Log-probabilities (B,) float32 of the given ``actions`` under the policy's own
        action distribution, recomputed from ``input_batch`` (as :meth:`compute_actions`
        takes it). No gradient, no random number drawn. ``VTrace`` uses it for the target
        policy's log-probabilities of recorded actions. Tensor input gives a float32
        tensor (B,) on the device of ``obs`` (policies that take tensors).

        Raises:
            NotImplementedError: the policy has no action distribution.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no action distribution: compute_log_likelihoods needs "
            "a policy that outputs distribution inputs (e.g. MLPPolicy, LSTMPolicy, TorchPolicy)"
        )

    def compute_single_action(
        self, obs: Any, state: list[np.ndarray] | None = None, explore: bool = True
    ) -> tuple[Any, list[np.ndarray], dict[str, np.ndarray]]:
        """Unbatched convenience: one observation in, one action (and state, fetches) out."""
        batch: dict[str, Any] = {"obs": tree.map_structure(lambda x: np.asarray(x)[None], obs)}
        for i, s in enumerate(state if state is not None else self.get_initial_state()):
            batch[f"state_in_{i}"] = np.asarray(s)[None]
        actions, state_outs, extra = self.compute_actions(batch, explore=explore)
        return (
            tree.map_structure(lambda x: x[0], actions),
            [s[0] for s in state_outs],
            {k: v[0] for k, v in extra.items()},
        )

    def get_initial_state(self) -> list[np.ndarray]:
        """One unbatched array per state tensor; an empty list for non-recurrent policies."""
        return []

    def is_recurrent(self) -> bool:
        """True if the policy has state (needs ``state_in_*`` and returns ``state_outs``)."""
        return len(self.get_initial_state()) > 0

    def num_state_tensors(self) -> int:
        """How many ``state_in_*`` columns :meth:`compute_actions` expects."""
        return len(self.get_initial_state())

    # -- weights -------------------------------------------------------------------------

    @classmethod
    def weight_shapes(
        cls, observation_space: gym.Space, action_space: gym.Space, **kwargs: Any
    ) -> WeightShapes | None:
        """The ``(name, shape)`` of each weight a policy built with these arguments would
        have, computed without building it; None when the class cannot tell.

        Loaders of saved policies (``load_policy``, ``EnvRunner.from_checkpoint``,
        ``export_policy`` from a checkpoint) compare them with the stored weights before
        anything is built (``check_declared_weights``), so a file whose config declares a
        network far larger than its weights is refused at once, with little memory. A
        registered kind that keeps the default None is built first and checked by its
        ``set_weights``. Pairs may be produced lazily; invalid arguments raise what the
        constructor would. A class that keeps this base class's ``get_weights`` has none.

        A class declares its shapes by defining ``_shapes_of_arguments(arguments)``: it gets
        the constructor's arguments bound by name with their defaults applied (an unknown
        one raises TypeError here, as the constructor would). The hook is not inherited: a
        subclass may build another network from other arguments, so it declares None unless
        it defines its own hook (or overrides this method).
        """
        own = cls.__dict__.get("_shapes_of_arguments")
        if own is not None:
            arguments = inspect.signature(cls).bind(observation_space, action_space, **kwargs)
            arguments.apply_defaults()
            return cast(WeightShapes, own.__get__(None, cls)(arguments.arguments))
        if cls.get_weights is Policy.get_weights:
            return iter(())
        return None

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the policy's weights by name (empty for weightless policies)."""
        return {}

    @_counts_versions
    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Load weights by name; names and shapes must match :meth:`get_weights` exactly.
        Each call is a new version of the weights (``weights_seq`` grows by one)."""
        validate_weights({}, weights, type(self).__name__)

    # -- training hooks ------------------------------------------------------------------

    def postprocess_trajectory(
        self,
        batch: Any,
        other_agent_batches: Mapping[Any, Any] | None = None,
        episode: Any = None,
    ) -> Any:
        """Post-process one agent trajectory (e.g. compute advantages); identity by default."""
        return batch

    # -- seeding and specs -----------------------------------------------------------------

    def seed(self, seed: int | None = None) -> None:
        """Re-seed the policy's own generators (``None``: fresh OS entropy)."""
        self._seed = check_seed(seed)
        self.np_random = np.random.default_rng(self._seed)

    def get_random_state(self) -> Any:
        """A snapshot of the policy's random state, for ``set_random_state``.

        ``EnvRunner.evaluate()`` takes one before it acts and puts it back after, so an
        evaluation never changes what training draws next. By default it holds the numpy
        and torch generators the policy keeps as attributes; a policy that keeps random
        state anywhere else (in a nested object, a list of generators, a library's global
        generator) overrides both methods to include it, or evaluations would shift what
        its training samples."""
        torch = sys.modules.get("torch")  # a torch.Generator exists only once torch is imported
        stateful: tuple[type, ...] = (np.random.RandomState,)
        if torch is not None:
            stateful = (np.random.RandomState, torch.Generator)
        saved: list[tuple[Any, Any]] = []
        for value in vars(self).values():
            if isinstance(value, np.random.Generator):
                saved.append((value, copy.deepcopy(value.bit_generator.state)))
            elif isinstance(value, stateful):
                saved.append((value, value.get_state()))  # type: ignore[attr-defined]
        return saved

    def set_random_state(self, state: Any) -> None:
        """Put back a snapshot taken by ``get_random_state``."""
        for gen, gen_state in state:
            if isinstance(gen, np.random.Generator):
                gen.bit_generator.state = gen_state
            else:
                gen.set_state(gen_state)

    def get_config(self) -> dict[str, Any]:
        """JSON-able constructor keyword arguments (besides the spaces) to rebuild the policy."""
        return {"config": dict(self.config), "seed": self._seed}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(observation_space={self.observation_space}, "
            f"action_space={self.action_space})"
        )
