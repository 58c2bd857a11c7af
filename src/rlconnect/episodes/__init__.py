"""Episodes: per-sub-env bookkeeping that callbacks and metrics read."""

from rlconnect.episodes.episode import Episode

__all__ = ["Episode"]
