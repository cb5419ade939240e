"""Checks on a merged or hand-resolved file set before a rebase accepts it.

Every touched file: no conflict markers left. Every touched Python file: it
compiles, and pyflakes finds no undefined name and no redefinition of an unused
name (ruff's F821/F811) that the new base's own version of the file does not
already have. Each problem names ``file:line``.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import warnings
from collections.abc import Mapping

from pyflakes import checker, messages

from .merge3 import marker_lines

# F821 (undefined name, local, export) and F811 (redefinition of an unused name).
FLAGGED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport,
           messages.RedefinedWhileUnused)

_cache: dict[str, list[tuple[int, str, str]]] = {}


def _flakes(path: str, data: bytes) -> list[tuple[int, str, str]]:
    """(line, key, message) for each flagged pyflakes message; the key leaves line numbers out."""
    digest = hashlib.sha256(data).hexdigest()
    if digest not in _cache:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(data, filename=path)
        found = []
        for msg in checker.Checker(tree, filename=path).messages:
            if isinstance(msg, FLAGGED):
                key = f"{type(msg).__name__}:{msg.message_args[0]}"
                found.append((msg.lineno, key, msg.message % msg.message_args))
        _cache[digest] = found
    return _cache[digest]


def _syntax(path: str, data: bytes) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(data, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{path}:{exc.lineno or 0}: does not compile: {exc.msg}"
    except ValueError as exc:  # e.g. null bytes
        return f"{path}:1: does not compile: {exc}"
    return None


def check_files(files: Mapping[str, bytes | None], base: Mapping[str, bytes | None]) -> list[str]:
    """Problems of `files` (path -> new contents; None: deleted), judged against the new
    base's versions `base` so that upstream's own pyflakes findings do not count."""
    problems: list[str] = []
    for path, data in files.items():
        if data is None or data == base.get(path):
            continue
        lines = marker_lines(data)
        if lines:
            problems.extend(f"{path}:{n}: conflict marker left" for n in lines)
            continue
        if not path.endswith(".py"):
            continue
        bad = _syntax(path, data)
        if bad:
            problems.append(bad)
            continue
        old = base.get(path)
        known = collections.Counter(key for _, key, _ in _flakes(path, old)) if old and not _syntax(path, old) \
            else collections.Counter()
        for line, key, text in _flakes(path, data):
            if known[key] > 0:
                known[key] -= 1
                continue
            problems.append(f"{path}:{line}: {text}")
    return problems
