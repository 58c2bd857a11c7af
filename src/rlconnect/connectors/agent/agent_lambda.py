"""AgentLambda: one agent-data column mapped through a function registered by name."""

from __future__ import annotations

from typing import Any

from rlconnect.connectors.base import AgentConnector, AgentData
from rlconnect.connectors.registry import get_lambda, register_connector

__all__ = ["AgentLambda"]


@register_connector("AgentLambda")
class AgentLambda(AgentConnector):
    """``data[column] = fn(data[column])``, with ``fn`` registered via ``rc.register_lambda``.

    On the tensor path the function receives the column's torch tensors (every row of
    the fixed layout; outputs of rows outside ``data.mask`` are ignored) and must return
    tensors without reading them on the host. The function receives and returns the whole
    column (all rows), never one row. The
    declared output space is the input space (identity): a lambda that changes the shape of
    ``obs`` is not checked by the pipeline, so keep such lambdas last.

    Args:
        fn: the registered name of the function (looked up now: an unknown name raises
            ``UnknownConnectorError`` listing the registered lambdas).
        column: the column to map, ``"obs"`` by default.
    """

    takes_tensors = True

    def __init__(self, ctx: Any, fn: str, column: str = "obs") -> None:
        super().__init__(ctx, fn=fn, column=column)
        self._fn = get_lambda(fn)
        self.column = column

    def __call__(self, data: AgentData) -> AgentData:
        """Replace ``column`` with ``fn`` of it (``fn`` sees the whole batch at once)."""
        data[self.column] = self._fn(data[self.column])
        return data

    def closing_row(self, data: AgentData) -> AgentData:
        """A closing row's ``column`` mapped like every other row's, when it has one (its
        ``rewards``: a lambda on ``obs`` has nothing to map there)."""
        return self(data) if self.column in data else data
