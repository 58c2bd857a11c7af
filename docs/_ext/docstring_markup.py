"""A griffe extension used by the docs build: render the library's docstrings as Markdown.

The docstrings are written for doctest and for reading in a terminal. Two habits of theirs
are not Markdown, and this extension rewrites them in the *rendered* copy only (the source
files are not touched):

- doctest examples (``>>> ...`` lines, their ``...`` continuations and expected output,
  up to the next blank line) become fenced ``pycon`` code blocks; as plain Markdown, the
  ``>`` would turn into nested block quotes and ``[2, 2]`` into a link reference
  (indented examples are left alone: Markdown already shows them as code);
- a paragraph ending in reST's literal-block marker ``::`` ends in ``:``;
- Sphinx roles such as :class:`Policy` or :meth:`compute_actions` become code spans;
- an attribute documented by ``#:`` comment lines right above it (Sphinx autodoc's
  convention, used for the fields of attrs classes such as ``RunnerConfig``) gets those
  lines as its docstring, which griffe does not read by itself.

Loaded by ``mkdocs.yml`` (``extensions: [docs/_ext/docstring_markup.py]``).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const):`~?([^`]+)`")
_PROMPT = re.compile(r"^()>>>(?: |$)")  # top-level prompts only
_LITERAL_MARKER = re.compile(r"::[ \t]*$", re.MULTILINE)


def fence_doctests(text: str) -> str:
    """Wrap each doctest block (``>>>`` up to the next blank line) in a ```pycon fence."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else _PROMPT.match(line)
        if match is None:
            out.append(line)
            i += 1
            continue
        indent = match.group(1)
        if out and out[-1].strip():
            out.append("")  # a fence needs a blank line before it inside a paragraph
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


def to_markdown(text: str) -> str:
    """Doctest blocks fenced, Sphinx roles turned into code spans."""
    text = _LITERAL_MARKER.sub(":", fence_doctests(text))
    return _ROLE.sub(r"`\1`", text)


class DocstringMarkup(griffe.Extension):
    """Rewrites every docstring's value before mkdocstrings parses and renders it."""

    def on_instance(self, *, node: ast.AST | Any, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None and obj.is_attribute:
            comment = comment_docstring(obj)
            if comment:
                obj.docstring = griffe.Docstring(comment, lineno=obj.lineno, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)


def comment_docstring(obj: griffe.Object) -> str:
    """The ``#:`` comment lines directly above an attribute's definition, joined."""
    if obj.lineno is None or obj.filepath is None:
        return ""
    try:
        lines = obj.lines_collection[obj.filepath]
    except KeyError:
        return ""
    found: list[str] = []
    index = obj.lineno - 2  # the line above the definition, 0-based
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        found.append(lines[index].lstrip()[2:].strip())
        index -= 1
    return "\n".join(reversed(found))
