"""EnvSettings: what building a runner's env takes besides the env, declared and checked once.

``RunnerConfig`` takes these settings as its own flat fields (each field's default and
check come from here, through ``env_field``) and hands them on as one object
(``RunnerConfig.env_settings()``); ``make_base_env`` and every env adapter take that
object. Adding a setting is a field of ``EnvSettings`` (its default and check) and its
line in ``RunnerConfig`` (``name: type = env_field("name", ...)``, with its doc).

>>> EnvSettings(num_envs=4, num_env_workers=2).num_env_workers
2
>>> EnvSettings(seed=-1)
Traceback (most recent call last):
...
ValueError: env setting seed=-1: must be None or an integer >= 0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from rlconnect.connectors.settings import setting_field
from rlconnect.envs.sub_envs import ContextRule, EnvContext, sub_env_contexts

__all__ = ["MAX_NUM_ENVS", "MAX_WORKER_PROCESSES", "EnvSettings", "env_field"]

MAX_NUM_ENVS = 1 << 12
"""Most sub-envs one runner builds (a bound on what a checkpoint's config can ask for)."""

MAX_WORKER_PROCESSES = 256
"""Most env worker processes one runner starts (``remote_envs=True``: one per sub-env), so
a config read from a file (a checkpoint, ``rlconnect sample --config``) cannot make it fork
thousands of processes; more sub-envs in processes: several runners (``rc.RunnerGroup``)."""

_OWNER = "env setting "

Check = Callable[[Any, Any], None]
"""``check(settings, value)``: raises ValueError (or TypeError) saying what is allowed;
``settings`` is the object being built, for checks against ``num_envs``."""


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num_envs(s: Any, value: Any) -> None:
    if not _int(value) or value < 1:
        raise ValueError("must be an integer >= 1")
    if value > MAX_NUM_ENVS:
        raise ValueError(f"at most {MAX_NUM_ENVS}")


def _seed(s: Any, value: Any) -> None:
    if value is not None and (not _int(value) or value < 0):
        raise ValueError("must be None or an integer >= 0")


def _dict(s: Any, value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError("must be a dict")


def _non_negative(s: Any, value: Any) -> None:
    if not _int(value) or value < 0:
        raise ValueError("must be an integer >= 0")


def _bool(s: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError("must be True or False")


def _optional_bool(s: Any, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError("must be True, False or None")


def _timeout(s: Any, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ValueError("must be None or a number of seconds > 0")


def _env_workers(s: Any, value: Any) -> None:
    if not _int(value):
        raise TypeError("must be an integer >= 0")
    if not 0 <= value <= s.num_envs:
        raise ValueError(
            f"must be between 0 (sub-envs in this process) and num_envs={s.num_envs} (one "
            "worker per sub-env)"
        )


def _env_poll_size(s: Any, value: Any) -> None:
    if value is None:
        return
    if not _int(value):
        raise TypeError("must be None or an integer")
    if not 1 <= value <= s.num_envs:
        raise ValueError(
            f"must be None or between 1 and num_envs={s.num_envs} (sub-envs a poll waits for)"
        )


def _horizon(s: Any, value: Any) -> None:
    if value is not None and (not _int(value) or value < 1):
        raise ValueError("must be an integer >= 1")


def _setting(default: Any, check: Check) -> Any:
    """An ``EnvSettings`` field: its default and its check (kept in the field's metadata,
    for ``env_field`` to give another class the same rule)."""
    field_default = attrs.Factory(default) if default is dict else default
    return attrs.field(
        default=field_default, validator=_validator(check, _OWNER), metadata={"check": check}
    )


def _validator(check: Check, owner: str) -> Callable[[Any, attrs.Attribute, Any], None]:
    def validate(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        try:
            check(inst, value)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{owner}{attribute.name}={value!r}: {exc}") from None

    return validate


def env_field(name: str, owner: str) -> Any:
    """An attrs field with the default and the check of env setting ``name``; a bad value
    raises ``"{owner}{name}={value!r}: <what is allowed>"``. ``RunnerConfig`` declares its
    env fields with it (``owner="RunnerConfig."``); typed ``Any`` like ``attrs.field``."""
    if name == "preset":  # a connector setting too: its rules live there
        return setting_field("preset", owner)
    field = attrs.fields_dict(EnvSettings)[name]
    return attrs.field(default=field.default, validator=_validator(field.metadata["check"], owner))


def check_processes(s: Any, owner: str) -> None:
    """What no single field says: worker processes stay under ``MAX_WORKER_PROCESSES``."""
    if s.remote_envs and s.num_envs > MAX_WORKER_PROCESSES:
        raise ValueError(
            f"{owner}remote_envs=True with num_envs={s.num_envs} would start "
            f"{s.num_envs} worker processes: at most {MAX_WORKER_PROCESSES} "
            "(MAX_WORKER_PROCESSES); use fewer sub-envs, num_env_workers instead (several "
            "sub-envs per worker), or several runners (rc.RunnerGroup)"
        )
    if s.num_env_workers > MAX_WORKER_PROCESSES:
        raise ValueError(
            f"{owner}num_env_workers={s.num_env_workers}: at most {MAX_WORKER_PROCESSES} "
            "worker processes (MAX_WORKER_PROCESSES); give each worker several sub-envs"
        )


def check_timeouts(s: Any, owner: str) -> None:
    """Only a sub-env in a worker process can be timed out: a timeout without workers is
    a mistake in a config (``make_base_env`` itself ignores it, as an evaluation env built
    from an instance in this process does)."""
    for name in ("sub_env_timeout_s", "env_build_timeout_s"):
        value = getattr(s, name)
        if value is not None and not (s.remote_envs or s.num_env_workers):
            raise ValueError(
                f"{owner}{name}={value!r} needs remote_envs=True or num_env_workers >= 1: "
                "only a sub-env in a worker process can be timed out"
            )


@attrs.frozen(kw_only=True)
class EnvSettings:
    """What ``make_base_env`` is asked for besides the env: an env adapter's second argument
    (``RunnerConfig.env_settings()``; the fields' docs are ``RunnerConfig``'s)."""

    num_envs: int = _setting(1, _num_envs)
    seed: int | None = _setting(None, _seed)
    env_config: dict[str, Any] = _setting(dict, _dict)
    worker_index: int = _setting(0, _non_negative)
    remote_envs: bool = _setting(False, _bool)
    preset: str | None = setting_field("preset", _OWNER)
    sub_env_timeout_s: float | None = _setting(None, _timeout)
    env_build_timeout_s: float | None = _setting(None, _timeout)
    #: env worker processes (0: this process) and sub-envs a poll waits for (None: all)
    num_env_workers: int = _setting(0, _env_workers)
    env_poll_size: int | None = _setting(None, _env_poll_size)
    #: the runner's horizon, for env engines that truncate episodes themselves (EnvPool)
    horizon: int | None = _setting(None, _horizon)
    soft_horizon: bool = _setting(False, _bool)
    #: the tensor path for a gymnasium VectorEnv: None decides from the env (a ``device``
    #: attribute), True forces it, False keeps the numpy path
    tensor: bool | None = _setting(None, _optional_bool)

    def __attrs_post_init__(self) -> None:
        check_processes(self, _OWNER)

    @property
    def in_workers(self) -> bool:
        """Whether the sub-envs step in env worker processes (``num_env_workers`` of them,
        or one per sub-env with ``remote_envs``)."""
        return bool(self.num_env_workers or self.remote_envs)

    def contexts(self) -> ContextRule:
        """How sub-env ``i`` is built (and first seeded) after ``r`` rebuilds, in this
        process: ``contexts()(i, r)``."""
        return sub_env_contexts(self.num_envs, self.worker_index, self.seed, self.env_config)

    def context(self, index: int) -> EnvContext:
        """The ``EnvContext`` sub-env ``index`` is built with (first build, not a restart)."""
        return self.contexts()(index, 0)
