"""The record of applied patches that an installed vLLM carries: ``vllm_patch.json`` in its dist-info.

Two writers produce it, the site-packages target (``apply``) and the wheel builder, and
one reader (``status``, ``revert``, a later ``apply``) must understand both, so its
format lives here alone. It holds each applied patch's text (a revert works even after
the series has changed), the original RECORD lines of the files they change and the hash of
each as the tool left it (what the guard checks at vLLM's start), under a schema number: a
file from a newer vllm-patch is refused instead of misread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .. import __version__
from ..errors import InputError, TargetError
from .patchfile import Patch, parse_patch

STATE_FILE = "vllm_patch.json"
SCHEMA = 1
# Files written before the schema number existed hold the same fields (record_index optional).
LEGACY = 0


@dataclass(frozen=True)
class AppliedState:
    """What ``vllm_patch.json`` says: the applied patches and the RECORD lines they replaced."""

    patches: tuple[tuple[str, str, str], ...]
    """(name, sha256, text) of each applied patch, in order."""
    record: dict[str, str | None] = field(default_factory=dict)
    """Each changed file's RECORD line before the series (None: the series created the file)."""
    record_index: dict[str, int] = field(default_factory=dict)
    """Where those lines stood in RECORD, so a deleted file's line goes back in place."""
    written: dict[str, str] | None = field(default=None, compare=False)
    """Each changed file's hash (``sha256=...``, as RECORD writes it) as the tool left it; a file the
    series deleted has none. The guard checks the files against it without reading RECORD. None in a
    record an older vllm-patch wrote; not compared, so such a record is not rewritten for it alone."""

    @classmethod
    def of(cls, patches: Sequence[Patch], record: Mapping[str, str | None],
           record_index: Mapping[str, int] | None = None, written: Mapping[str, str] | None = None) -> AppliedState:
        return cls(tuple((p.name, p.sha256, p.raw.decode("utf-8")) for p in patches), dict(record),
                   dict(record_index or {}), None if written is None else dict(written))

    def dump(self) -> bytes:
        """The file's bytes (stable: sorted keys, one trailing newline)."""
        return (json.dumps({
            "schema": SCHEMA,
            "tool": f"vllm-patch {__version__}",
            "patches": [{"name": n, "sha256": h, "text": t} for n, h, t in self.patches],
            "record": self.record,
            "record_index": self.record_index,
            **({} if self.written is None else {"written": self.written}),
        }, indent=1, sort_keys=True) + "\n").encode("utf-8")

    def parsed_patches(self, where: str) -> list[Patch]:
        try:
            return [parse_patch(name, text.encode("utf-8")) for name, _, text in self.patches]
        except InputError as exc:
            raise TargetError(f"{where} holds a malformed patch ({exc.message}); reinstall vLLM to start over") \
                from None


def load(data: bytes, where: str) -> AppliedState:
    """Read the file's bytes; anything but a known schema is a TargetError naming `where`."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise TargetError(f"{where} is unreadable ({exc}); reinstall vLLM to start over") from None
    if not isinstance(raw, dict):
        raise TargetError(f"{where} is malformed (not a JSON object); reinstall vLLM to start over")
    schema = raw.get("schema", LEGACY)
    if schema not in (LEGACY, SCHEMA):
        raise TargetError(f"{where} has schema {schema!r}, written by {raw.get('tool') or 'another vllm-patch'}; "
                          f"vllm-patch {__version__} reads schema {SCHEMA} only: upgrade vllm-patch")
    try:
        patches = tuple((str(p["name"]), str(p["sha256"]), str(p["text"])) for p in raw["patches"])
        record = {str(k): (None if v is None else str(v)) for k, v in dict(raw.get("record", {})).items()}
        index = {str(k): int(v) for k, v in dict(raw.get("record_index", {})).items()}
        written = None if raw.get("written") is None else {str(k): str(v) for k, v in dict(raw["written"]).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TargetError(f"{where} is malformed ({type(exc).__name__}: {exc}); reinstall vLLM to start over") \
            from None
    return AppliedState(patches, record, index, written)
