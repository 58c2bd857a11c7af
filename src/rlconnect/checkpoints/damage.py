"""One wording for each kind of damage a file rlconnect wrote can have, so ``rlconnect
inspect``, ``rc.load_policy``, ``load_pipeline`` and checkpoint restores say the same
thing about the same file (each prefixes it with ``cannot load <what> <path>:``)."""

from __future__ import annotations

__all__ = [
    "APPENDED",
    "DIGEST_MISMATCH",
    "EMPTY",
    "TRUNCATED",
    "TRUNCATED_OR_NOT",
    "size_damage",
    "truncated",
]

EMPTY = "the file is empty (truncated to 0 bytes); write or copy it again"

TRUNCATED = (
    "truncated: {have:,} of its {want:,} bytes are there (a write or copy stopped early); "
    "write or copy it again"
)
"""A file shorter than its own header says (``{have}`` and ``{want}`` bytes)."""

APPENDED = (
    "bytes appended: {extra:,} more than it should hold (appended to, or two files "
    "joined); write or copy it again"
)

DIGEST_MISMATCH = (
    "digest mismatch: its content changed after it was written (damaged or edited); "
    "write or copy it again"
)
"""A file whose recorded SHA-256 does not match its content."""

TRUNCATED_OR_NOT = "not a complete {what} (truncated, or another kind of file)"
"""A file too short or too malformed to tell how long it should be."""


def truncated(have: int, want: int) -> str:
    """:data:`TRUNCATED` for a file of ``have`` bytes that should hold ``want``."""
    return TRUNCATED.format(have=have, want=want)


def size_damage(have: int, want: int) -> str:
    """A file of ``have`` bytes where ``want`` were recorded: truncated or appended to."""
    return truncated(have, want) if have < want else APPENDED.format(extra=have - want)
