"""The error of the ``rlconnect`` command for bad input: one line, exit code 2."""

from __future__ import annotations


class UsageError(Exception):
    """Bad arguments, config file, env id or path: one line on stderr, exit code 2."""
