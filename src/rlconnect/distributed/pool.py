"""The remote runners of a RunnerGroup: starting, calling, failing, restarting them.

Ray is passed in (imported by the group only when ``num_runners > 0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlconnect.distributed.faults import (
    FaultTolerance,
    RunnerFailedError,
    RunnerFailure,
    describe_error,
)
from rlconnect.distributed.worker import RemoteRunner, RunnerSpec
from rlconnect.runner import EnvRunner

__all__ = ["RunnerPool"]


class RunnerPool:
    """Actors ``1..K`` by runner index; a failed one is restarted, dropped or reported."""

    def __init__(
        self,
        ray: Any,
        spec: RunnerSpec,
        local: EnvRunner,
        num_runners: int,
        resources: Mapping[str, Any],
        faults: FaultTolerance,
        checkpoint_files: Mapping[str, bytes] | None = None,
    ) -> None:
        self._ray = ray
        self.local_runner = local
        self.faults = faults
        self.promised_rows = local.config.rollout_fragment_length * local.config.num_envs
        self._resources = dict(resources)
        self._actor_cls = ray.remote(RemoteRunner)
        self._spec_ref = ray.put(spec)  # one copy in the object store for every actor
        self.checkpoint_ref: Any = None
        if checkpoint_files is not None:
            self.checkpoint_ref = ray.put(dict(checkpoint_files))
        self.weights_ref: Any = None
        self.failures: list[RunnerFailure] = []
        self._incarnation = dict.fromkeys(range(1, num_runners + 1), 0)
        #: runner index -> live actor (absent: dropped after a failure)
        self.actors = {k: self._start_actor(k, 0) for k in self._incarnation}
        self._wait_started()

    @property
    def indices(self) -> list[int]:
        """The indices of the live actors, ascending (the order results come back in)."""
        return sorted(self.actors)

    def versions(self) -> dict[str, int]:
        """The local runner's ``weights_seq`` by policy id: what remote runners take with
        its weights, so a version names the same weights on every runner."""
        return {pid: p.weights_seq for pid, p in self.local_runner.policies.items()}

    def submit_sample(self, k: int) -> Any:
        """Ask runner ``k`` for its next batch; the object ref of ``(batch, deltas)``."""
        return self.actors[k].sample.remote()

    def abandon(self, refs: list[Any], timeout_s: float) -> None:
        """Let requests nobody will read finish (up to ``timeout_s``); drop their results."""
        self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)

    def _start_actor(self, k: int, incarnation: int) -> Any:
        actor = self._actor_cls.options(**self._resources).remote(self._spec_ref, k, incarnation)
        if self.checkpoint_ref is not None:
            actor.restore_files.remote(self.checkpoint_ref)
        return actor

    def _wait_started(self) -> None:
        """Wait for every actor to be built; a runner that cannot be names itself."""
        ray = self._ray
        refs = {self.actors[k].ready.remote(): k for k in self.indices}
        timeout = self.faults.start_timeout_s
        _, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        if late:
            self.kill_all()
            raise RunnerFailedError(
                f"remote runners {sorted(refs[r] for r in late)} were not started within "
                f"start_timeout_s={timeout}: the cluster may lack the resources they ask "
                f"for ({self._resources}); available now: {ray.available_resources()}"
            )
        self.call_all("ready")  # raises, naming the runner, if one failed to build

    def next_result(
        self, inflight: dict[Any, int], call: str, failures: list[RunnerFailure], resubmit: bool
    ) -> tuple[int, Any]:
        """Wait for one in-flight request; ``(k, (batch, deltas))``, or ``(k, None)`` after a
        failure that was handled (the request is then re-sent to a restarted runner)."""
        ray = self._ray
        timeout = self.faults.sample_timeout_s
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=timeout)
        if not ready:  # nobody finished in time: the oldest request is the slow one
            ref = next(iter(inflight))
            k = inflight.pop(ref)
            error: BaseException = ray.exceptions.GetTimeoutError(
                f"no batch from remote runner {k} within sample_timeout_s={timeout}"
            )
            ray.kill(self.actors[k], no_restart=True)
        else:
            ref = ready[0]
            k = inflight.pop(ref)
            try:
                return k, ray.get(ref)
            except ray.exceptions.RayError as exc:
                error = exc
        restarted = self.handle_failure(k, call, error, failures)
        if restarted and resubmit:
            inflight[self.submit_sample(k)] = k
        return k, None

    def handle_failure(
        self, k: int, call: str, error: BaseException, failures: list[RunnerFailure]
    ) -> bool:
        """Record the failure of runner ``k``; restart it (True), drop it, or raise."""
        error_type, cause = describe_error(error)
        incarnation = self._incarnation[k]
        ft = self.faults
        can_restart = ft.restart_failed_runners and incarnation < ft.max_runner_restarts
        if can_restart:
            action, missing = "restarted", 0
        elif ft.ignore_runner_failures:
            action, missing = "ignored", self.promised_rows
        else:
            action, missing = "raised", self.promised_rows
        record = RunnerFailure(
            runner_index=k,
            incarnation=incarnation,
            call=call,
            error_type=error_type,
            cause=cause,
            action=action,
            missing_rows=missing,
        )
        self.failures.append(record)
        failures.append(record)
        if action == "raised":
            budget = (
                f" after {incarnation} restart(s) (max_runner_restarts={ft.max_runner_restarts})"
                if ft.restart_failed_runners
                else " (pass fault_tolerance=rc.FaultTolerance(restart_failed_runners=True) "
                "or FaultTolerance(ignore_runner_failures=True) to continue without it)"
            )
            raise RunnerFailedError(
                f"remote runner {k} failed in {call}(): {error_type}: {cause}{budget}", record
            ) from error
        self._ray.kill(self.actors.pop(k), no_restart=True)
        if action == "ignored":
            return False
        self._incarnation[k] = incarnation + 1
        self.actors[k] = self._restart(k, incarnation + 1)
        return True

    def _restart(self, k: int, incarnation: int) -> Any:
        """A new actor for index ``k`` with the current weights and connector statistics."""
        actor = self._start_actor(k, incarnation)
        if self.weights_ref is None:
            self.weights_ref = self._ray.put(self.local_runner.get_weights())
        actor.set_weights.remote(self.weights_ref, self.versions())
        actor.set_connector_states.remote(self.local_runner.get_connector_states())
        return actor

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """Call ``method(*args)`` on every actor at once and wait for all; RunnerFailedError
        names the first runner that failed."""
        indices = self.indices
        refs = [getattr(self.actors[k], method).remote(*args) for k in indices]
        out = []
        for k, ref in zip(indices, refs):
            try:
                out.append(self._ray.get(ref))
            except self._ray.exceptions.RayError as exc:
                error_type, cause = describe_error(exc)
                raise RunnerFailedError(
                    f"remote runner {k} failed in {method}(): {error_type}: {cause}"
                ) from exc
        return out

    def kill_all(self, grace_s: float = 0.0) -> None:
        """Stop (waiting up to ``grace_s``) and kill every actor."""
        if self.actors and grace_s:
            refs = [a.stop.remote() for a in self.actors.values()]
            self._ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        for a in self.actors.values():
            self._ray.kill(a, no_restart=True)
        self.actors.clear()
