"""ActionLambda: one action-data column mapped through a function registered by name."""

from __future__ import annotations

from typing import Any

from rlconnect.connectors.base import ActionConnector, ActionData
from rlconnect.connectors.registry import get_lambda, register_connector

__all__ = ["ActionLambda"]


@register_connector("ActionLambda")
class ActionLambda(ActionConnector):
    """``data[column] = fn(data[column])``, with ``fn`` registered via ``rc.register_lambda``.

    On the tensor path the function receives the column's torch tensors (every row of
    the fixed layout; outputs of rows outside ``data.mask`` are ignored) and must return
    tensors without reading them on the host. The function receives and returns the whole
    column (all rows). The output space is the
    input space: a lambda that changes the action space is not checked by the pipeline.

    Args:
        fn: the registered name of the function (looked up now: an unknown name raises
            ``UnknownConnectorError`` listing the registered lambdas).
        column: the column to map, ``"actions"`` by default.
    """

    takes_tensors = True

    def __init__(self, ctx: Any, fn: str, column: str = "actions") -> None:
        super().__init__(ctx, fn=fn, column=column)
        self._fn = get_lambda(fn)
        self.column = column

    def __call__(self, data: ActionData) -> ActionData:
        """Replace ``column`` with ``fn`` of it (``fn`` sees the whole batch at once)."""
        data[self.column] = self._fn(data[self.column])
        return data
