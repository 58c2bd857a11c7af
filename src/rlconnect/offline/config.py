"""OfflineConfig: the settings of offline output and input, held by ``RunnerConfig.offline``.

``RunnerConfig(offline=rc.OfflineConfig(output=DIR))`` writes every batch the runner
samples under ``DIR``; ``RunnerConfig(output=DIR)`` says the same (each setting below is
a keyword of ``RunnerConfig`` too, see ``rlconnect.runner.extensions``). What the
settings do to a runner: ``rlconnect.offline.runner_io``.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlconnect.offline.runner_io import RunnerInput, RunnerOutput
from rlconnect.runner.extensions import register_config_section

__all__ = ["OfflineConfig"]

_OWNER = "OfflineConfig"


def _optional_str(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{_OWNER}.{attribute.name}={value!r}: must be a path string or None")


def _int_at_least(low: int) -> Any:
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{_OWNER}.{attribute.name}={value!r}: must be an integer >= {low}")

    return check


def _bool(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{_OWNER}.{attribute.name}={value!r}: must be True or False")


def _input_spec(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, str) and value:
        return
    if isinstance(value, dict) and value:
        probs = list(value.values())
        if (
            all(isinstance(k, str) and k for k in value)
            and all(
                isinstance(p, int | float) and not isinstance(p, bool) and p >= 0 for p in probs
            )
            and abs(sum(probs) - 1.0) < 1e-6
        ):
            return
    raise ValueError(
        f"{_OWNER}.input={value!r}: allowed are 'sampler', a path or glob, or a dict "
        "{source: probability} whose probabilities are >= 0 and sum to 1"
    )


def _estimators(inst: Any, attribute: attrs.Attribute, value: tuple) -> None:
    unknown = [v for v in value if v not in ("is", "wis")]
    if unknown:
        raise ValueError(
            f"{_OWNER}.off_policy_estimation={value!r}: unknown {unknown}; allowed 'is', 'wis'"
        )


def _unit_interval(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{_OWNER}.{attribute.name}={value!r}: must be a number in [0, 1]")


def _str_tuple(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # tuple("obs") would be its letters
        return (value,)
    return tuple(value)


@attrs.frozen(kw_only=True)
class OfflineConfig:
    """Where a runner writes what it samples and where it reads experience from. Every
    setting is checked when the config is built; each is also a keyword of
    ``rc.RunnerConfig`` (``RunnerConfig(output=DIR)``, ``RunnerConfig(input=PATH)``)."""

    #: write every sampled batch under this folder (Parquet; None: don't write)
    output: str | None = attrs.field(default=None, validator=_optional_str)
    #: roll output files at this size in bytes
    output_max_file_size: int = attrs.field(default=64 * 1024 * 1024, validator=_int_at_least(1))
    #: columns stored compressed in output files
    output_compress_columns: tuple[str, ...] = attrs.field(
        default=("obs", "new_obs"), converter=_str_tuple
    )
    #: "sampler", a path or glob of offline files, or {source: probability}
    input: Any = attrs.field(default="sampler", validator=_input_spec)
    #: rows held in the shuffle buffer when reading offline data (0: no shuffling)
    shuffle_buffer_size: int = attrs.field(default=0, validator=_int_at_least(0))
    #: run the current policy's postprocess_trajectory over episodes read from files
    postprocess_inputs: bool = attrs.field(default=False, validator=_bool)
    #: pass observations read from files through the agent connectors
    input_connectors: bool = attrs.field(default=False, validator=_bool)
    #: off-policy estimators ("is", "wis") run on batches read from files, for the current
    #: policies; results come from ``runner.get_off_policy_metrics()``
    off_policy_estimation: tuple[str, ...] = attrs.field(
        default=(), converter=_str_tuple, validator=_estimators
    )
    #: discount of the off-policy estimates
    off_policy_gamma: float = attrs.field(default=1.0, validator=_unit_interval)

    def __attrs_post_init__(self) -> None:
        if self.off_policy_estimation and self.input == "sampler":
            raise ValueError(
                f"{_OWNER}.off_policy_estimation needs input= files to estimate on "
                "(a path, a glob, or a dict of sources)"
            )

    def attach(self, runner: Any) -> None:
        """Give ``runner`` the output writer and input mixer these settings ask for: the
        writer as a batch sink, the mixer as its batch source."""
        if self.output is not None:
            runner.add_batch_sink(RunnerOutput(runner, self).write)
        if self.input != "sampler":
            runner.set_batch_source(RunnerInput(runner, self))

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-able values."""
        return attrs.asdict(self)

    def without_paths(self) -> OfflineConfig:
        """No output folder, live input, and so no off-policy estimates (they need files)."""
        return attrs.evolve(self, output=None, input="sampler", off_policy_estimation=())


register_config_section("offline", OfflineConfig)
