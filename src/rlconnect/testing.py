"""Test helpers for your own connectors: inherit the connector contract as test methods.

In the spirit of dm_env's ``EnvironmentTestMixin``: a test class sets how to build the
thing under test and inherits one test per check of ``rlconnect.checker``::

    import gymnasium as gym
    import rlconnect as rc
    from rlconnect.testing import ConnectorTestMixin

    class TestMyScaler(ConnectorTestMixin):          # pytest; or also subclass TestCase
        def make_connector(self):
            ctx = rc.ConnectorContext(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
            return MyScaler(ctx, scale=0.5)

Override ``make_pipeline()`` instead to test a whole chain, ``make_observations()`` to
feed your own rows (default: 8 seeded samples of the input space) and
``check_options()`` for ``env_ids``, ``agent_ids``, ``rewards``, ``actions`` or ``steps``.
Every built-in connector is tested through this mixin.

A connector that declares ``takes_tensors = True`` is also checked on torch tensors
(``test_tensor_matches_numpy``, on ``tensor_device()``, "cpu" by default); for one that
does not, that test checks that its pipeline names it in ``tensor_refusals()``.
``HostReadCounter`` counts device-to-host reads of torch tensors inside a ``with`` block,
for tests of your own tensor code.
"""

from __future__ import annotations

from typing import Any

from rlconnect.checker import (
    CHECKS,
    check_eval_freezes_statistics,
    check_isolation_and_reset,
    check_output_in_space,
    check_save_load_reproduces,
    check_tensor_matches_numpy,
)
from rlconnect.connectors._host_reads import HOST_READS, HostReadCounter
from rlconnect.connectors.base import Connector
from rlconnect.connectors.pipeline import ConnectorPipeline

__all__ = ["CHECKS", "HOST_READS", "ConnectorTestMixin", "HostReadCounter"]


class ConnectorTestMixin:
    """Inherited tests: output in space, save/load, isolation and reset, eval freezes stats."""

    def make_connector(self) -> Connector:
        """The connector under test (override this or ``make_pipeline``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must override make_pipeline() or make_connector()"
        )

    def make_pipeline(self) -> ConnectorPipeline | Connector:
        """The pipeline under test; by default the one connector of ``make_connector()``."""
        return self.make_connector()

    def make_observations(self) -> Any:
        """A stacked batch of inputs (raw observations, or policy outputs for action
        pipelines); None samples 8 rows of the input space with a fixed seed."""
        return None

    def check_options(self) -> dict[str, Any]:
        """Extra keyword arguments for the checks (``env_ids``, ``agent_ids``, ``steps``...)."""
        return {}

    def tensor_device(self) -> str:
        """The torch device ``test_tensor_matches_numpy`` runs on."""
        return "cpu"

    def _run_check(self, fn: Any) -> None:
        fn(self.make_pipeline(), self.make_observations(), **self.check_options())

    def test_output_in_space(self) -> None:
        """Every member's output lies in the space it declares."""
        self._run_check(check_output_in_space)

    def test_save_load_reproduces(self) -> None:
        """save_pipeline / load_pipeline reproduce the outputs exactly."""
        self._run_check(check_save_load_reproduces)

    def test_isolation_and_reset(self) -> None:
        """Per-(env, agent) state is isolated; reset(env_id) clears only that env."""
        self._run_check(check_isolation_and_reset)

    def test_eval_freezes_statistics(self) -> None:
        """In eval mode, calls leave the statistics unchanged."""
        self._run_check(check_eval_freezes_statistics)

    def test_tensor_matches_numpy(self) -> None:
        """On tensors, the numpy outputs (float32 rounding), no host read, portable state;
        a connector that does not take tensors is named by ``tensor_refusals()``."""
        obj = self.make_pipeline()
        if isinstance(obj, ConnectorPipeline):
            refused = obj.tensor_refusals()
        else:
            refused = [] if obj.takes_tensors else [obj.name]
        if refused:  # the runner refuses it on the tensor path, naming these
            assert not obj.takes_tensors, f"takes_tensors is True but {refused} refuse tensors"
            return
        options = self.check_options()
        device = self.tensor_device()
        check_tensor_matches_numpy(obj, self.make_observations(), device=device, **options)
