"""The errors of the ``rlconnect`` command: bad input (one line, exit code 2), and the
install command of an optional extra a failure shows to be missing."""

from __future__ import annotations

import importlib.util

EXTRA_OF_MODULE = {
    "pettingzoo": "pettingzoo",
    "pygame": "pettingzoo",
    "ray": "ray",
    "matplotlib": "plot",
    "msgpack": "serve",
    "pyarrow": "offline",
    "ale_py": "atari",
    "cv2": "atari",
    "envpool": "envpool",
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "onnxscript": "onnx",
    "tensorboard": "tensorboard",
}
"""Top-level module -> the rlconnect extra that installs it."""


class UsageError(Exception):
    """Bad arguments, config file, env id or path: one line on stderr, exit code 2."""


def missing_extra(exc: BaseException) -> str:
    """``" (the X extra: pip install 'rlconnect[X]')"`` when ``exc`` (or its cause) is a
    missing module whose top-level package extra X installs and is not installed, and
    ``exc`` does not say so already, else ``""`` (a module missing inside an installed
    package is not fixed by installing it again)."""
    if "pip install" in str(exc):
        return ""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            top = seen.name.partition(".")[0]
            extra = EXTRA_OF_MODULE.get(top)
            if extra and _not_installed(top):
                return f" (the {extra} extra: pip install 'rlconnect[{extra}]')"
        seen = seen.__cause__ or seen.__context__
    return ""


def _not_installed(top: str) -> bool:
    try:
        return importlib.util.find_spec(top) is None
    except (ImportError, ValueError):  # a broken or half-imported package
        return True
