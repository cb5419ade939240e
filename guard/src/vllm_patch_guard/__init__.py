"""vllm-patch-guard: at vLLM's start, says when the installed vLLM has a vllm-patch release line
that is not applied; with ``VLLM_PATCH_GUARD=strict`` it refuses to start instead.

vLLM calls every ``vllm.general_plugins`` entry point at start, in every process
(``vllm.plugins.load_general_plugins``); this distribution registers `check` there.

What it knows, ``lines.json`` next to this file, was generated when the guard was built, from
the repository's ``series`` and ``lines/*/series`` (``guard/setup.py``): for each release line its
name, the vLLM version it is pinned to, its patches (name, sha256) and its digest.

What it reads at start: the installed vLLM's dist-info (its version) and ``vllm_patch.json``, the
record ``vllm-patch apply`` leaves there (the applied patches' names and texts, the files they
changed and their hashes as the tool left them); when that record is the line's, the changed files
themselves, hashed against it (a record of an older tool, without the hashes: against the RECORD
the tool rewrote), so a file put back or edited by hand since is said as ``vllm-patch status``
says it. Nothing else, and it imports nothing beyond the
standard library: vLLM's modules pull torch and the tool
(``vllm_patch``) pulls click, rich, GitPython and more, none of which belongs in every vLLM
process's start. That is why this module duplicates two small pieces of the tool, which its tests
hold equal to the tool's: the reading of ``vllm_patch.json`` (``vllm_patch.engine.state``: its
``schema`` and ``patches``) and the series digest (``vllm_patch.series.Series.digest``).

``VLLM_PATCH_GUARD``: unset or ``warn``, one warning line on stderr (once per process tree);
``strict``, refuse to start (SystemExit with that one line); ``off``, do nothing. Any other value
refuses to start, naming it: a mistyped ``strict`` must not weaken the guard. A vLLM no line is
pinned to passes silently.
"""

from __future__ import annotations

import binascii
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
# The values of VLLM_PATCH_GUARD, and what each means; anything else refuses to start.
MODES = {"": "warn", "warn": "warn", "strict": "strict", "off": "off", "0": "off", "false": "off", "no": "off"}


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


def _recorded(text: str) -> tuple[list[tuple[str, bytes]], list[str], dict[str, str] | None]:
    """What ``vllm_patch.json`` records: (name, bytes) of each patch, the files they changed, and the
    hash of each as the tool left them (None from an older tool); ValueError when it is unreadable."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    schema = raw.get("schema", 0)
    if schema not in SCHEMAS:
        raise ValueError(f"schema {schema!r}, written by {raw.get('tool') or 'another vllm-patch'}")
    try:
        patches = [(str(p["name"]), str(p["text"]).encode("utf-8")) for p in raw["patches"]]
        changed = [str(path) for path in dict(raw.get("record") or {})]
        written = raw.get("written")
        written = None if written is None else {str(k): str(v) for k, v in dict(written).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed: {type(exc).__name__}: {exc}") from None
    return patches, changed, written


def _record_hashes(text: str, paths: list[str]) -> dict[str, str]:
    """The hash field (``sha256=...``) RECORD gives each of `paths` that it lists. Paths are matched as
    they start a line; a path needing CSV quotes (a comma, a quote) is read with the csv module."""
    if any("," in p or '"' in p for p in paths):
        import csv
        wanted = set(paths)
        return {row[0]: row[1] for row in csv.reader(text.splitlines()) if len(row) > 1 and row[0] in wanted}
    found = {}
    text = "\n" + text
    for path in paths:
        at = text.find(f"\n{path},")
        if at >= 0:
            start = at + len(path) + 2
            found[path] = text[start:text.find(",", start)]
    return found


def _changed_by_hand(dist, paths: list[str], written: dict[str, str] | None) -> list[str]:
    """The files among `paths` (those the line changed) that are no longer what the tool wrote: each
    with the hash `written` (the record) gives it, else (a record of an older tool) the one RECORD
    gives it, or absent where the line deleted it. Bytecode aside, what ``vllm-patch status`` checks."""
    if not paths:
        return []
    hashes = written if written is not None else _record_hashes(dist.read_text("RECORD") or "", paths)
    changed = []
    for path in paths:
        try:
            with open(dist.locate_file(path), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            data = None
        expected = hashes.get(path)
        if expected is None:  # the line deleted it
            if data is not None:
                changed.append(f"{path} (present again)")
        elif data is None:
            changed.append(f"{path} (missing)")
        elif _hash(expected.partition("=")[0], data) != expected:
            changed.append(path)
    return changed


def _hash(algorithm: str, data: bytes) -> str:
    """`data`'s hash as RECORD writes it (``sha256=`` and urlsafe base64 without padding); binascii, not
    base64, whose import costs more than the hashing of a file."""
    digest = binascii.b2a_base64(hashlib.new(algorithm, data).digest(), newline=False).rstrip(b"=")
    return f"{algorithm}={digest.replace(b'+', b'-').replace(b'/', b'_').decode()}"


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
        recorded, paths, written = _recorded(text)
    except ValueError as exc:
        return (f"{head}, but its record {RECORD} in the dist-info is unreadable ({exc}); "
                f"run: vllm-patch status --python {python}")
    found = digest(line["version"], line["commit"], recorded)
    if found == line["digest"]:
        changed = _changed_by_hand(dist, paths, written)
        if not changed:
            return None
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        verb = "is" if len(changed) == 1 else "are"
        return (f"{head}, applied, but {', '.join(changed[:3])}{more} {verb} no longer what vllm-patch wrote "
                f"(edited, restored or removed since); run: vllm-patch status --python {python}")
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
    raw = os.environ.get(ENV, "")
    mode = MODES.get(raw.strip().lower())
    if mode is None:
        raise SystemExit(f"{PREFIX} refusing to start: {ENV}={raw!r} is not one of warn, strict, off "
                         "(a mistyped strict must not weaken the guard)")
    if mode == "off":
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
