"""An installed vLLM: the site-packages directory of some interpreter, or an unpacked wheel.

The distribution is found with importlib.metadata, never by importing vLLM.
Touched files are checked against RECORD before any write; RECORD is
rewritten after (new files included, so ``pip uninstall`` removes them);
stale bytecode of changed modules is removed; and ``vllm_patch.json`` in the
dist-info records which patches are applied (with their text, so a later
run can revert them even after the series has changed).
"""

from __future__ import annotations

import json
import subprocess
from importlib.metadata import PathDistribution
from pathlib import Path

from packaging.utils import canonicalize_name

from ..engine import record
from ..engine.analysis import Analysis, Contents
from ..engine.patchfile import Patch
from ..engine.state import STATE_FILE, AppliedState, load
from ..errors import TargetError
from .base import Found, Goal, Plan, Target


def site_packages_of(python: str) -> Path:
    """The directory holding vLLM for interpreter `python` (purelib or platlib)."""
    code = "import json, sysconfig; p = sysconfig.get_paths(); print(json.dumps([p['purelib'], p['platlib']]))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TargetError(f"cannot ask {python} for its site-packages: {exc}") from None
    candidates = [Path(p) for p in json.loads(out.stdout)]
    for c in candidates:
        if c.is_dir() and find_dist_info(c, required=False) is not None:
            return c.resolve()
    raise TargetError(f"no vLLM distribution is installed for {python} "
                      f"(looked in {', '.join(map(str, dict.fromkeys(candidates)))})")


def find_dist_info(directory: Path, required: bool = True) -> Path | None:
    """The ``vllm-*.dist-info`` directory in `directory`, read with importlib.metadata."""
    found = []
    for candidate in sorted(directory.glob("*.dist-info")):
        if not candidate.name.lower().startswith("vllm-"):
            continue
        name = PathDistribution(candidate).metadata["Name"] or ""
        if canonicalize_name(name) == "vllm":
            found.append(candidate)
    if len(found) > 1:
        raise TargetError(f"{directory} holds several vLLM distributions: "
                          f"{', '.join(p.name for p in found)}; remove the stale ones")
    if not found:
        if required:
            raise TargetError(f"no vllm-*.dist-info in {directory}: is vLLM installed there?")
        return None
    return found[0]


def pyc_of(root: Path, rel: str) -> list[str]:
    """Bytecode caches of a module, which go stale when its source changes."""
    if not rel.endswith(".py"):
        return []
    src = Path(rel)
    cache = root / src.parent / "__pycache__"
    if not cache.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in cache.glob(f"{src.stem}.*.pyc") if p.is_file())


class SitePackagesTarget(Target):
    """vLLM installed in a site-packages directory (or an unpacked wheel)."""

    kind = "site-packages"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.dist_info = find_dist_info(root)
        self.dist = PathDistribution(self.dist_info)

    @property
    def rel_dist_info(self) -> str:
        return self.dist_info.name

    @property
    def record_path(self) -> str:
        return f"{self.rel_dist_info}/RECORD"

    @property
    def state_path(self) -> str:
        return f"{self.rel_dist_info}/{STATE_FILE}"

    @property
    def lock_dir(self) -> Path:
        return self.dist_info

    @property
    def journal(self):
        from ..infrastructure.transaction import Journal
        return Journal.of(self.root, self.dist_info.name)

    def check_holds_vllm(self) -> None:
        """Its vLLM dist-info says it holds vLLM."""

    def found(self) -> Found:
        commit = self._version_file().commit
        return Found(self.dist.version, commit, f"{self.dist_info.name} and vllm/_version.py")

    def _record_text(self) -> str:
        try:
            # Bytes, not read_text(): pip writes RECORD with CRLF and a revert must keep it.
            return (self.root / self.record_path).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TargetError(f"cannot read {self.record_path}: {exc}") from None

    def state(self) -> AppliedState | None:
        path = self.root / self.state_path
        if not path.is_file():
            return None
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise TargetError(f"{path} is unreadable ({exc.strerror}); reinstall vLLM to start over") from None
        return load(data, self.state_path)

    def recorded_patches(self) -> list[Patch] | None:
        state = self.state()
        return None if state is None else state.parsed_patches(self.state_path)

    def verify_before_write(self, paths: list[str], contents: Contents, analysis: Analysis) -> None:
        """Every touched file must be as RECORD has it. All problems are named at once, so that one
        reinstall (or one revert of another tool) clears them, not one run per file."""
        lines = record.parse_lines(self._record_text()).lines
        known = record.entries(lines, paths, self.record_path)
        unrecorded, missing, edited = [], [], []
        for rel in paths:
            data = contents.get(rel)
            if rel not in known:
                if data is not None:
                    unrecorded.append(rel)
                continue
            entry = known[rel][1]
            if data is None:
                missing.append(rel)
            elif entry.hash_ is not None and not record.matches(entry, data):
                edited.append(rel)
        problems = []
        if edited:
            problems.append(f"{', '.join(edited)} {_verb(edited, 'differs', 'differ')} from {self.record_path}: "
                            "another tool has edited what pip installed; reinstall vLLM (or revert that tool) first")
        if missing:
            problems.append(f"{', '.join(missing)} {_verb(missing, 'is', 'are')} listed in {self.record_path} "
                            "but missing; reinstall vLLM")
        if unrecorded:
            problems.append(f"{', '.join(unrecorded)} {_verb(unrecorded, 'exists', 'exist')} but not in "
                            f"{self.record_path}: something other than pip or vllm-patch put it there")
        if problems:
            raise TargetError("; and ".join(problems))

    def integrity(self, paths: list[str], full: bool) -> list[str]:
        lines = record.parse_lines(self._record_text()).lines
        known = record.entries(lines, None if full else paths, self.record_path)
        check = [p for p, (_, e) in known.items() if e.hash_ is not None]
        problems = []
        for rel in check:
            if "/__pycache__/" in f"/{rel}" and rel.endswith(".pyc"):
                continue  # bytecode is derived; Python rewrites it
            entry = known[rel][1]
            path = self.root / rel
            if not path.is_file():
                problems.append(f"{rel}: missing")
            elif entry.hash_ is not None and not record.matches(entry, path.read_bytes()):
                problems.append(f"{rel}: hash differs from RECORD")
        return problems

    def plan(self, goal: Goal) -> Plan:
        paths = list(goal.new)
        current = self.read(paths)
        changes: Contents = {p: d for p, d in goal.new.items() if current.get(p) != d}
        for rel in list(changes):
            for pyc in pyc_of(self.root, rel):
                changes[pyc] = None
        state = self.state()
        prior: dict[str, str | None] = dict(state.record) if state else {}
        prior_at: dict[str, int] = dict(state.record_index) if state else {}
        originals, original_at = dict(prior), dict(prior_at)
        text = self._record_text()
        parsed = record.parse_lines(text)
        lines = parsed.lines
        at = record.index(lines)
        kept = goal.patches[:goal.keep]
        sources = [rel for rel in changes if not rel.endswith(".pyc")]
        for rel in sources:
            if rel not in originals:
                originals[rel] = lines[at[rel]] if rel in at else None
                if rel in at:
                    original_at[rel] = at[rel]
        if kept:
            # Rewritten only when what it says changes (a patched wheel's copy, or one an
            # older vllm-patch wrote, stays as it is when nothing is to be done).
            new_state = AppliedState.of(kept, originals, original_at, self._written(originals, changes, current))
            if new_state != state:
                changes[self.state_path] = new_state.dump()
        elif (self.root / self.state_path).exists():
            changes[self.state_path] = None
        wanted: dict[str, str | None] = {}
        for rel in sources:
            data = changes[rel]
            if not kept and rel in prior:
                wanted[rel] = prior[rel]
                self._check_restores(rel, prior[rel], data)
            else:
                wanted[rel] = None if data is None else record.make_line(rel, data)
        if self.state_path in changes:
            wanted[self.state_path] = record.make_line(self.state_path, None) if kept else None
        by_index = {at[rel]: line for rel, line in wanted.items() if rel in at}
        out = [by_index.get(i, line) if i in by_index else line for i, line in enumerate(lines)]
        out = [line for i, line in enumerate(out) if not (i in by_index and by_index[i] is None)]
        back = {rel: line for rel, line in wanted.items()
                if rel not in at and line is not None and not kept and rel in prior_at}
        added = [line for rel, line in wanted.items() if rel not in at and line is not None and rel not in back]
        pos = self._insert_at(out)
        out[pos:pos] = added
        # Lines of files a patch had deleted go back where they were.
        for rel in sorted(back, key=prior_at.__getitem__):
            out.insert(prior_at[rel], back[rel])
        new_record = parsed.text(out).encode("utf-8")
        if new_record != text.encode("utf-8"):
            changes[self.record_path] = new_record
        return Plan(changes)

    def _written(self, originals: dict[str, str | None], changes: Contents, current: Contents) -> dict[str, str]:
        """The hash of each file the series changed, as this write leaves it (the state's `written`)."""
        unread = [rel for rel in originals if rel not in changes and rel not in current]
        final = {**current, **self.read(unread), **changes}
        return {rel: record.record_hash(final[rel]) for rel in originals if final.get(rel) is not None}

    def _check_restores(self, rel: str, line: str | None, data: bytes | None) -> None:
        """A revert must give back the bytes the original RECORD line describes."""
        entry = record.entry_of(line) if line is not None else None
        if line is None and data is None:
            return
        if entry is None or data is None or (entry.hash_ is not None and not record.matches(entry, data)):
            raise TargetError(f"reverting would not restore the original {rel} recorded in "
                              f"{self.state_path}; nothing was changed; reinstall vLLM")

    def _insert_at(self, lines: list[str]) -> int:
        """New entries go before the dist-info's own RECORD line, as pip orders them."""
        for i, line in enumerate(lines):
            if line.startswith(self.record_path + ","):
                return i
        return len(lines)


def _verb(paths: list[str], one: str, many: str) -> str:
    return one if len(paths) == 1 else many
