"""vllm-patch-guard: at vLLM's start, says when the installed vLLM has a vllm-patch release line
that is not applied; with ``VLLM_PATCH_GUARD=strict`` it refuses to start instead.

vLLM calls every ``vllm.general_plugins`` entry point at start, in every process
(``vllm.plugins.load_general_plugins``); this distribution registers `check` there.

What it knows, ``lines.json`` next to this file, was generated when the guard was built, from
the repository's ``series`` and ``lines/*/series`` (``guard/setup.py``): for each release line its
name, the vLLM version it is pinned to, its patches (name, sha256) and its digest.

What it reads at start: the installed vLLM's dist-info (its version) and ``vllm_patch.json``, the
record ``vllm-patch apply`` leaves there (the applied patches' names and texts). Nothing else, and
it imports nothing beyond the standard library: vLLM's modules pull torch and the tool
(``vllm_patch``) pulls click, rich, GitPython and more, none of which belongs in every vLLM
process's start. That is why this module duplicates two small pieces of the tool, which its tests
hold equal to the tool's: the reading of ``vllm_patch.json`` (``vllm_patch.engine.state``: its
``schema`` and ``patches``) and the series digest (``vllm_patch.series.Series.digest``).

``VLLM_PATCH_GUARD``: unset or ``warn``, one warning line on stderr (once per process tree);
``strict``, refuse to start (SystemExit with that one line); ``off``, do nothing. A vLLM no line
is pinned to passes silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

__version__ = "0.1.0"

ENV = "VLLM_PATCH_GUARD"
# Set once this process tree has warned: vLLM starts several processes, each calls the plugin.
WARNED = "VLLM_PATCH_GUARD_WARNED"
DATA = "lines.json"
# The record the tool writes into vLLM's dist-info, and the schemas of it this guard reads.
RECORD = "vllm_patch.json"
SCHEMAS = (0, 1)
PREFIX = "vllm-patch-guard:"


def digest(version: str, commit: str, patches: list[tuple[str, bytes]]) -> str:
    """The series digest as ``vllm_patch.series.Series.digest`` computes it: the pin's version and
    commit, then each patch's name and bytes, in order (sha256, the first 12 hex digits)."""
    h = hashlib.sha256(f"{version}\0{commit}\0".encode())
    for name, raw in patches:
        h.update(name.encode() + b"\0" + raw + b"\0")
    return h.hexdigest()[:12]


def public_version(version: str) -> tuple | str:
    """The version without its local label (``0.33.0+vp.abc`` -> ``0.33.0``), as a tuple of
    numbers without trailing zeros where it is plain ``X.Y.Z``: the pin comparison of the tool
    (``packaging``'s ``Version.public``) for the versions vLLM releases carry."""
    public = version.strip().lower().split("+", 1)[0].removeprefix("v")
    parts = public.split(".")
    if not all(p.isdigit() for p in parts):
        return public
    numbers = [int(p) for p in parts]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def load_lines(path: str | None = None) -> list[dict]:
    """The lines this guard was built with (``lines.json``)."""
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), DATA)
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["lines"]


def line_for(version: str, lines: list[dict]) -> dict | None:
    """The line that covers vLLM `version` (its pin, or a release it declares with ``#: also``), if any."""
    wanted = public_version(version)
    return next((line for line in lines
                 if wanted in {public_version(v) for v in (line["version"], *line.get("also", ()))}), None)


def installed_version(dist) -> str:
    """The ``Version`` header of the dist-info's METADATA, read from the headers alone: ``dist.version``
    parses the whole file (vLLM's holds its README) with the email package, a millisecond at every start."""
    for line in (dist.read_text("METADATA") or "").splitlines():
        if not line.strip():
            break  # the headers end; the description follows
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "version":
            return value.strip()
    return dist.version or ""


def _recorded(text: str) -> list[tuple[str, bytes]]:
    """(name, bytes) of each patch ``vllm_patch.json`` records; ValueError when it is unreadable."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    schema = raw.get("schema", 0)
    if schema not in SCHEMAS:
        raise ValueError(f"schema {schema!r}, written by {raw.get('tool') or 'another vllm-patch'}")
    try:
        return [(str(p["name"]), str(p["text"]).encode("utf-8")) for p in raw["patches"]]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed: {type(exc).__name__}: {exc}") from None


def diagnose(dist=None, lines: list[dict] | None = None, python: str | None = None) -> str | None:
    """What is wrong with the installed vLLM (`dist`, default the ``vllm`` distribution), in one
    line that names the fix; None when nothing is (no vLLM, no line for it, or its line applied)."""
    if dist is None:
        from importlib.metadata import PackageNotFoundError, distribution
        try:
            dist = distribution("vllm")
        except PackageNotFoundError:
            return None
    version = installed_version(dist)
    line = line_for(version, load_lines() if lines is None else lines)
    if line is None:
        return None
    wanted = [(name, sha) for name, sha in line["patches"]]
    python = _quote(python or sys.executable)
    fix = f"run: vllm-patch apply --python {python}"
    head = f"vLLM {version} has release line {line['name']} (series {line['digest']}, {len(wanted)} patches)"
    text = dist.read_text(RECORD)
    if not text:
        return f"{head}, not applied; {fix}"
    try:
        recorded = _recorded(text)
    except ValueError as exc:
        return (f"{head}, but its record {RECORD} in the dist-info is unreadable ({exc}); "
                f"run: vllm-patch status --python {python}")
    found = digest(line["version"], line["commit"], recorded)
    if found == line["digest"]:
        return None
    have = [(name, hashlib.sha256(raw).hexdigest()) for name, raw in recorded]
    if not have:
        return f"{head}, not applied; {fix}"
    if len(have) < len(wanted) and have == wanted[:len(have)]:
        return f"{head}, applied partly ({len(have)} of {len(wanted)}, up to {have[-1][0]}); {fix}"
    return (f"{head}, but another series is applied (series {found}, {len(have)} patches); {fix} "
            f"(if it says applied, this guard is older than the series: reinstall it from the same checkout)")


def _quote(path: str) -> str:
    """`path` as a shell word (shlex.quote without importing shlex)."""
    if path and all(c.isalnum() or c in "@%+=:,./-_" for c in path):
        return path
    return "'" + path.replace("'", "'\"'\"'") + "'"


def check() -> None:
    """The ``vllm.general_plugins`` entry point: warn, refuse to start (strict) or pass."""
    mode = os.environ.get(ENV, "warn").strip().lower()
    if mode in ("off", "0", "false", "no"):
        return
    try:
        problem = diagnose()
    except Exception as exc:  # a guard that cannot read must not stop a vLLM it was not asked to stop
        problem = f"cannot check the installed vLLM ({type(exc).__name__}: {exc})"
    if problem is None:
        return
    if mode == "strict":
        raise SystemExit(f"{PREFIX} refusing to start ({ENV}=strict): {problem}")
    if os.environ.get(WARNED):
        return
    os.environ[WARNED] = "1"
    print(f"{PREFIX} WARNING: {problem}", file=sys.stderr, flush=True)
