"""The lifecycle of an in-process adapter's sub-envs, written once for every adapter.

A sub-env is built by the env creator from its ``EnvContext``, seeded on its first reset
(``seed + index``, or a fresh derived seed after a restart), asked to step, reset or
soft-reset at the next poll, remembered by its last observation (for soft resets) and its
last failure (which a rebuild names), rebuilt when it raised, and closed. ``SubEnvs`` holds
all of that; ``GymEnvs`` and ``MultiAgentEnvs`` each hold one and only turn what their
sub-envs return into rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from rlconnect.errors import EnvError, describe_exception

__all__ = [
    "ContextRule",
    "EnvContext",
    "SubEnvs",
    "rebuild_error",
    "sub_env_context",
    "sub_env_contexts",
    "sub_env_seed",
]


@attrs.define(frozen=True)
class EnvContext:
    """Passed to env creators: which sub-env is being built and with what seed."""

    vector_index: int = 0
    num_envs: int = 1
    worker_index: int = 0
    seed: int | None = None
    config: dict[str, Any] = attrs.field(factory=dict)


def sub_env_seed(seed: int | None, index: int, restarts: int = 0) -> int | None:
    """Seed of sub-env ``index``: ``seed + index``; a restarted env gets a fresh derived seed."""
    if seed is None:
        return None
    if restarts == 0:
        return seed + index
    return int(np.random.SeedSequence([seed, index, restarts]).generate_state(1)[0])


def rebuild_error(env_id: int, failure: BaseException | None, exc: BaseException) -> EnvError:
    """Sub-env ``env_id`` failed with ``failure`` (None: not known) and building it anew
    raised ``exc``: the error names both (raise it from ``failure or exc``)."""
    what = f" after it raised {describe_exception(failure)}" if failure is not None else ""
    told = describe_exception(exc).removeprefix(f"{type(exc).__name__}: ")  # its message
    return EnvError(f"sub-env {env_id} could not be rebuilt{what}; {told}")


def sub_env_context(
    index: int,
    num_envs: int,
    worker_index: int,
    seed: int | None,
    restarts: int,
    config: dict[str, Any],
) -> EnvContext:
    """The context sub-env ``index`` is built with after ``restarts`` rebuilds (its first
    reset takes ``ctx.seed``): one rule for every adapter, in the runner or a worker."""
    return EnvContext(
        vector_index=index,
        num_envs=num_envs,
        worker_index=worker_index,
        seed=sub_env_seed(seed, index, restarts),
        config=config,
    )


ContextRule = Callable[[int, int], EnvContext]
"""``(index, restarts) -> EnvContext``: how an adapter builds (and first seeds) sub-env
``index`` after ``restarts`` rebuilds."""


def sub_env_contexts(
    num_envs: int, worker_index: int, seed: int | None, config: dict[str, Any] | None
) -> ContextRule:
    """The ``ContextRule`` of ``num_envs`` sub-envs in the runner's process; env workers
    give their adapters ``GroupSpec.local_context`` instead (global indices)."""
    config = dict(config or {})

    def context(index: int, restarts: int) -> EnvContext:
        return sub_env_context(index, num_envs, worker_index, seed, restarts, config)

    return context


class SubEnvs:
    """``num_envs`` sub-envs and what each does at the next poll.

    ``creator(EnvContext)`` builds sub-env ``i`` from ``contexts(i, restarts)``; ``check``
    (optional) raises if what it built is not of the adapter's kind. ``envs`` given: those
    instances, built elsewhere. The adapter's poll reads and empties ``actions`` (sub-env ->
    its pending action), ``needs_reset`` and ``soft`` (sub-envs to reset, or to start anew
    from ``last`` without a reset), resets through ``reset`` (which seeds a first reset)
    and notes each failure in ``failures`` for ``try_restart`` to name.
    """

    def __init__(
        self,
        creator: Callable[[EnvContext], Any],
        num_envs: int,
        contexts: ContextRule,
        *,
        envs: list[Any] | None = None,
        check: Callable[[Any], None] | None = None,
    ) -> None:
        self._creator = creator
        self._contexts = contexts
        self._check = check
        self._restarts = [0] * num_envs
        built = envs if envs is not None else [self._make(i) for i in range(num_envs)]
        self.envs: list[Any] = built
        self._seeded = [False] * num_envs
        self.needs_reset: set[int] = set(range(num_envs))
        self.soft: set[int] = set()
        self.actions: dict[int, Any] = {}
        self.last: dict[int, tuple[Any, Any]] = {}
        self.failures: dict[int, BaseException] = {}

    def _make(self, index: int) -> Any:
        env = self._creator(self._contexts(index, self._restarts[index]))
        if self._check is not None:
            self._check(env)
        return env

    def reset(self, index: int) -> Any:
        """Reset sub-env ``index`` (seeded with its context's seed the first time after it
        was built) and return what its ``reset`` returned."""
        seed = None
        if not self._seeded[index]:
            seed = self._contexts(index, self._restarts[index]).seed
            self._seeded[index] = True
        return self.envs[index].reset(seed=seed)

    def try_reset(self, env_id: int) -> None:
        """Reset ``env_id`` at the next poll, dropping its pending action."""
        self.needs_reset.add(env_id)
        self.actions.pop(env_id, None)

    def soft_reset(self, env_id: int) -> None:
        """Start ``env_id`` anew from its last observation at the next poll."""
        self.soft.add(env_id)
        self.actions.pop(env_id, None)

    def try_restart(self, env_id: int) -> None:
        """Close and rebuild ``env_id`` (with its next context), which resets seeded at the
        next poll; if the rebuild raises, an ``EnvError`` names it and the last failure."""
        with contextlib.suppress(Exception):  # closing must not mask an earlier error
            self.envs[env_id].close()
        self._restarts[env_id] += 1
        failure = self.failures.pop(env_id, None)
        try:
            self.envs[env_id] = self._make(env_id)
        except Exception as exc:
            raise rebuild_error(env_id, failure, exc) from (failure or exc)
        self._seeded[env_id] = False
        self.try_reset(env_id)

    def close(self) -> None:
        """Close every sub-env; an error closing one is swallowed so it cannot mask the
        error that made the runner stop."""
        for env in self.envs:
            with contextlib.suppress(Exception):  # closing must not mask an earlier error
                env.close()
