"""RunnerConfig: every knob of the runner, typed and validated at construction."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, cast

import attrs

from rlconnect.collectors.modes import BatchMode, CountStepsBy
from rlconnect.connectors.settings import ConnectorSettings, setting_field
from rlconnect.envs.settings import EnvSettings, check_processes, check_timeouts, env_field
from rlconnect.runner.extensions import ConfigSection, config_sections

__all__ = ["BatchMode", "CountStepsBy", "RunnerConfig"]


def _enum(kind: type[enum.Enum]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in kind)
            raise ValueError(f"{value!r} is not one of {allowed}") from None

    return convert


def _positive_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"RunnerConfig.{attribute.name}={value!r}: must be an integer >= 1")


def _bool(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"RunnerConfig.{attribute.name}={value!r}: must be True or False")


def _callable_or_none(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not callable(value):
        raise ValueError(f"RunnerConfig.{attribute.name}={value!r}: must be callable or None")


def _non_negative_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"RunnerConfig.{attribute.name}={value!r}: must be an integer >= 0")


def _wrap(kind: type[enum.Enum], name: str) -> Callable[[Any], Any]:
    conv = _enum(kind)

    def convert(value: Any) -> Any:
        try:
            return conv(value)
        except ValueError as exc:
            raise ValueError(f"RunnerConfig.{name}: {exc}") from None

    return convert


_to_batch_mode = _wrap(BatchMode, "batch_mode")
_to_count_steps_by = _wrap(CountStepsBy, "count_steps_by")


def _batch_mode(value: Any) -> BatchMode:
    return cast(BatchMode, _to_batch_mode(value))


def _count_steps_by(value: Any) -> CountStepsBy:
    return cast(CountStepsBy, _to_count_steps_by(value))


_OWNER = "RunnerConfig."


def _to_section(field: str, value: Any) -> Any:
    """The value of section field ``field``: a section as given, or built from a dict."""
    if value is None or isinstance(value, ConfigSection):
        return value
    cls = config_sections().get(field)
    if isinstance(value, dict) and cls is not None:
        return cls(**value)
    kind = cls.__name__ if cls is not None else "config section"
    raise ValueError(
        f"RunnerConfig.{field}={value!r}: must be an {kind}, a dict of its settings, or None"
    )


def _offline(value: Any) -> ConfigSection | None:
    return cast("ConfigSection | None", _to_section("offline", value))


def _section_fields() -> list[str]:
    return [a.name for a in attrs.fields(RunnerConfig) if a.metadata.get("section")]


def _gather_sections(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the keywords of registered sections moved into their section
    (a TypeError names keywords that are neither a field nor a section's setting)."""
    out = dict(settings)
    fields = attrs.fields_dict(RunnerConfig)
    for name, cls in config_sections().items():
        given = {k: out.pop(k) for k in attrs.fields_dict(cls) if k in out}
        if given:
            base = _to_section(name, out.get(name))
            out[name] = attrs.evolve(base, **given) if base is not None else cls(**given)
    unknown = [k for k in out if k not in fields]
    if unknown:
        allowed = ", ".join(RunnerConfig.keywords())
        raise TypeError(f"RunnerConfig got unknown settings {unknown}; allowed: {allowed}")
    return out


@attrs.define(kw_only=True, init=False)
class RunnerConfig:
    """How an EnvRunner samples. Every field is checked when the config is built."""

    #: sub-environments stepped together (sub-env i is seeded ``seed + i``; <= MAX_NUM_ENVS)
    num_envs: int = env_field("num_envs", _OWNER)
    #: steps per sub-env in one ``sample()``: a batch holds ``rollout_fragment_length * num_envs``
    rollout_fragment_length: int = attrs.field(default=200, validator=_positive_int)
    #: "truncate_episodes" (exact size, episodes continue) or "complete_episodes"
    batch_mode: BatchMode = attrs.field(default=BatchMode.TRUNCATE_EPISODES, converter=_batch_mode)
    #: count the fragment in "env_steps" or "agent_steps"
    count_steps_by: CountStepsBy = attrs.field(
        default=CountStepsBy.ENV_STEPS, converter=_count_steps_by
    )
    #: every sub-env gives exactly ``rollout_fragment_length`` rows per batch, rows sub-env
    #: major (``meta["rows_per_env"]``, what ``batch.time_major()`` folds); needs
    #: "truncate_episodes" counted in "env_steps", and in multi-agent envs agents that act
    #: at every step
    equal_rows: bool = attrs.field(default=False, validator=_bool)
    #: truncate episodes after this many env steps (None: never)
    horizon: int | None = env_field("horizon", _OWNER)
    #: at the horizon start a new episode id without resetting the env
    soft_horizon: bool = env_field("soft_horizon", _OWNER)
    #: base seed of sub-envs and of the policies' samplers (None: not seeded)
    seed: int | None = env_field("seed", _OWNER)
    #: rebuild a sub-env whose step/reset raised (or that returned a non-finite or
    #: malformed observation or reward), dropping its episode from the data
    restart_failed_sub_environments: bool = attrs.field(default=False, validator=_bool)
    #: restarts of one sub-env in a row (no completed episode in between) before
    #: ``sample()`` gives up with an EnvError instead (a sub-env that fails every episode)
    sub_env_restart_limit: int = attrs.field(default=5, validator=_non_negative_int)
    #: seconds an env worker process (``num_env_workers`` or ``remote_envs``) may take for
    #: one poll of its sub-envs; past it the worker is killed and its sub-envs failed
    #: (restarted in a new worker with restarts on; None: wait)
    sub_env_timeout_s: float | None = env_field("sub_env_timeout_s", _OWNER)
    #: seconds an env worker process may take to build its sub-envs (the env creator's
    #: calls, at start-up and when a sub-env is rebuilt); past it the worker is killed and
    #: ``EnvTimeoutError`` raised. None: as long as they take, as in the runner's process
    env_build_timeout_s: float | None = env_field("env_build_timeout_s", _OWNER)
    #: check what envs return against their spaces on the first polls
    check_env: bool = attrs.field(default=True, validator=_bool)
    #: raise ``rc.EnvCheckError`` on a NaN or inf observation or reward at any step (with
    #: restarts, drop its episode instead); False stores such values as the env gave them
    check_finite: bool = attrs.field(default=True, validator=_bool)
    #: sample actions (True) or take the distribution's mode; False also freezes filters
    explore: bool = attrs.field(default=True, validator=_bool)
    # -- connector settings: defaults, checks and docs in ConnectorSettings ----------------
    #: "NoFilter" or "MeanStdFilter" (default agent pipeline)
    observation_filter: str = setting_field("observation_filter", "RunnerConfig.")
    #: "immediate" or "frozen": what the filter normalises with between syncs
    observation_filter_sync: str = setting_field("observation_filter_sync", "RunnerConfig.")
    #: None/False, True (sign) or a number x > 0 (default agent pipeline)
    clip_rewards: bool | float | None = setting_field("clip_rewards", "RunnerConfig.")
    #: stack this many frames (default agent pipeline)
    framestack: int | None = setting_field("framestack", "RunnerConfig.")
    #: clip actions into the Box bounds (default action pipeline)
    clip_actions: bool = setting_field("clip_actions", "RunnerConfig.")
    #: map policy outputs in [-1, 1] to the Box bounds (default action pipeline)
    normalize_actions: bool = setting_field("normalize_actions", "RunnerConfig.")
    #: also record ``env_actions``, what the env received
    record_env_actions: bool = attrs.field(default=False, validator=_bool)
    #: also record ``raw_obs``, the observations before the agent connectors
    keep_raw_obs: bool = attrs.field(default=False, validator=_bool)
    #: tensor path: record the env's infos as the column ``infos``, a nest of tensors (one
    #: row per sub-env and agent; values that are not per-sub-env tensors are left out).
    #: Off by default there; the numpy path records its ``infos`` column always
    record_infos: bool = attrs.field(default=False, validator=_bool)
    # -- env workers and asynchronous polls -------------------------------------------------
    #: step sub-envs in env worker processes, one per sub-env (``num_env_workers=num_envs``)
    remote_envs: bool = env_field("remote_envs", _OWNER)
    #: worker processes stepping the sub-envs through shared memory (0: in this process);
    #: at most ``num_envs``
    num_env_workers: int = env_field("num_env_workers", _OWNER)
    #: sub-envs a poll waits for (None or ``num_envs``: all of them); ``1 <= B < num_envs``
    #: returns as soon as B sub-envs have finished their step (env workers or EnvPool)
    env_poll_size: int | None = env_field("env_poll_size", _OWNER)
    #: sample in a background thread; ``sample()`` returns the next ready batch
    sample_async: bool = attrs.field(default=False, validator=_bool)
    #: ``fn(agent_obs, worker=, base_env=, policies=, episode=) -> agent_obs`` per env step
    observation_fn: Callable[..., dict] | None = attrs.field(
        default=None, validator=_callable_or_none
    )
    #: passed to env creators as ``EnvContext.config``
    env_config: dict[str, Any] = env_field("env_config", _OWNER)
    #: index of this runner among remote runners (0: local)
    worker_index: int = env_field("worker_index", _OWNER)
    #: preprocessing preset (None or "atari"; a connector setting)
    preset: str | None = env_field("preset", _OWNER)
    #: a VectorEnv of torch tensors takes the tensor path (columns stay on its device):
    #: None decides from the env (a ``device`` attribute), True forces, False refuses it
    tensor: bool | None = env_field("tensor", _OWNER)

    # -- settings sections of upper layers (``rlconnect.runner.extensions``) ---------------
    #: offline experience: an ``rc.OfflineConfig`` (or a dict of its settings; None: no
    #: offline output or input). Each of its settings is a keyword of RunnerConfig too:
    #: ``RunnerConfig(output=DIR)`` is ``RunnerConfig(offline=rc.OfflineConfig(output=DIR))``
    offline: ConfigSection | None = attrs.field(
        default=None, converter=_offline, metadata={"section": True}
    )
    # -- images (issue: pixels) -----------------------------------------------------------
    #: store image columns compressed in batches, decompressed on access
    compress_observations: bool = attrs.field(default=False, validator=_bool)

    def __init__(self, **settings: Any) -> None:
        """Every field by keyword, and each setting of a registered section (e.g.
        ``output=``, ``input=`` of ``rc.OfflineConfig``): those given are set on that
        section (on a copy of the one given as its field, if any)."""
        self.__attrs_init__(**_gather_sections(settings))

    @classmethod
    def keywords(cls) -> list[str]:
        """Every keyword ``RunnerConfig(...)`` takes: its fields, then the settings of
        the registered sections (what config files and checkpoints may hold)."""
        names = list(attrs.fields_dict(cls))
        for section in config_sections().values():
            names += list(attrs.fields_dict(section))
        return names

    def __attrs_post_init__(self) -> None:
        self._check_equal_rows()
        check_processes(self, _OWNER)
        check_timeouts(self, _OWNER)

    def _check_equal_rows(self) -> None:
        if not self.equal_rows:
            return
        if self.batch_mode is not BatchMode.TRUNCATE_EPISODES:
            raise ValueError(
                "RunnerConfig.equal_rows=True needs batch_mode='truncate_episodes' (whole "
                "episodes have unequal lengths); set equal_rows=False or truncate episodes"
            )
        if self.count_steps_by is not CountStepsBy.ENV_STEPS:
            raise ValueError(
                "RunnerConfig.equal_rows=True needs count_steps_by='env_steps' (its rows per "
                "sub-env are env steps); set equal_rows=False or count env steps"
            )

    def env_settings(self) -> EnvSettings:
        """This config's env settings (the fields declared with ``env_field``): what
        ``rlconnect.envs.make_base_env`` builds the env with."""
        return EnvSettings(**{k: getattr(self, k) for k in attrs.fields_dict(EnvSettings)})

    def connector_settings(self) -> ConnectorSettings:
        """This config's connector settings (the fields declared with ``setting_field``)."""
        fields = attrs.fields_dict(ConnectorSettings)
        return ConnectorSettings(**{k: getattr(self, k) for k in fields})

    def connector_config(self) -> dict[str, Any]:
        """The keys the default pipelines read (``ctx.config``)."""
        return self.connector_settings().to_config()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (callables left out), for checkpoints and the command line."""
        out = attrs.asdict(self, filter=lambda a, v: not callable(v) or isinstance(v, enum.Enum))
        out["batch_mode"] = self.batch_mode.value
        out["count_steps_by"] = self.count_steps_by.value
        for name in _section_fields():
            section = getattr(self, name)
            out[name] = None if section is None else section.to_dict()
        return out

    def sections(self) -> list[ConfigSection]:
        """The sections this config holds (those not None), e.g. its ``OfflineConfig``."""
        return [s for s in (getattr(self, n) for n in _section_fields()) if s is not None]

    def without_paths(self) -> RunnerConfig:
        """This config with every section's file paths at their defaults (what a
        checkpoint's saved config gives a rebuilt runner)."""
        changes = {n: getattr(self, n) for n in _section_fields() if getattr(self, n) is not None}
        return attrs.evolve(self, **{n: s.without_paths() for n, s in changes.items()})
