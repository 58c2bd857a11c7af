"""Importing a user's modules from the command line: ``--import MODULE`` (the modules that
register policy kinds and connectors) and the module of ``--env module:function``.

The current folder is importable, as with ``python -m``. A module that is not there is
named as such: the extra to install only when its top-level package is missing, and when
that package is installed, which module inside it does not exist.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from types import ModuleType

from rlconnect.cli.errors import UsageError, missing_extra

__all__ = ["add_import_option", "import_module", "import_user_modules"]


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable ``--import MODULE`` option (stored as ``args.imports``)."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first: the module that registers your policy kinds or connectors "
        "(rc.register_policy, rc.register_connector); repeatable; the current folder is "
        "importable",
    )


def _missing_inside(exc: ModuleNotFoundError) -> str | None:
    """``"no module X in the installed P package (version V)"`` when ``exc`` is a module
    missing inside a package that is installed, else None."""
    name = exc.name or ""
    top = name.partition(".")[0]
    if not top or top == name or importlib.util.find_spec(top) is None:
        return None
    try:
        version = f" {importlib.metadata.version(top)}"
    except importlib.metadata.PackageNotFoundError:  # a package without distribution data
        version = ""
    return f"there is no module {name!r} in the installed {top}{version} package"


def import_module(module: str, what: str) -> ModuleType:
    """Import ``module`` (the current folder importable); UsageError naming ``what`` it
    was for when it cannot be imported, with the reason."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        inside = _missing_inside(exc)
        if inside is not None:
            raise UsageError(f"cannot import {module!r} for {what}: {inside}") from None
        if exc.name == module.partition(".")[0] and not missing_extra(exc):
            raise UsageError(
                f"cannot import {module!r} for {what}: no module {exc.name!r} here or in the "
                f"installed packages (searched the current folder {cwd!r} and sys.path)"
            ) from None
        raise UsageError(
            f"cannot import {module!r} for {what}: {exc}{missing_extra(exc)}"
        ) from None
    except Exception as exc:  # any error while running the user's module
        raise UsageError(
            f"cannot import {module!r} for {what}: {type(exc).__name__}: {exc}{missing_extra(exc)}"
        ) from None


def import_user_modules(modules: list[str]) -> None:
    """Import every ``--import`` module, in order."""
    for module in modules:
        import_module(module, f"--import {module}")
