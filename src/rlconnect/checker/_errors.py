"""The error every pipeline check raises, naming the check and the member."""

from __future__ import annotations

from rlconnect.connectors.pipeline import ConnectorPipeline

__all__ = ["PipelineCheckError"]


class PipelineCheckError(ValueError):
    """A pipeline check failed: ``check``, ``member`` (None if not located) and ``detail``."""

    __module__ = "rlconnect.checker"  # its public home, as shown in tracebacks

    def __init__(self, check: str, detail: str, member: str | None = None, cls: str = "") -> None:
        where = ""
        if member is not None:
            where = f" at member {member!r}" + (f" ({cls})" if cls and cls != member else "")
        super().__init__(f"check_pipeline: {check} failed{where}: {detail}")
        self.check = check
        self.member = member
        self.detail = detail


def _fail(
    check: str, detail: str, pipe: ConnectorPipeline | None = None, member: str | None = None
) -> PipelineCheckError:
    cls = ""
    if pipe is not None and member is not None and member in pipe:
        cls = type(pipe[member]).__name__
    return PipelineCheckError(check, detail, member, cls)
