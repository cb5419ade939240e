"""Every patch of every line matters: the line built without it fails at least one of the tests that name it.

For each line and each patch, the tree is the line's pinned release with every other patch applied (a later
patch that needs the removed one is left out too, and said so). The tests that name the patch
(``@pytest.mark.patch("<name without its number>")``, in the test folders that judge the line) run on that tree
in one pytest run of their own, the way an ``Obsolete-If: test`` check runs (``$VLLM_PATCH_BASE_UNDER_TEST``,
``$VLLM_PATCH_PATCHED_TREE`` and, for a line that carries the current line's fixes, ``$VLLM_PATCH_V033_LINE``),
with ``$VLLM_PATCH_JUDGED_PATCH`` keeping only the tests that name it (tests/conftest.py). At least one must
fail (an assertion, not an error or a skip); that they pass with the whole line is what the test tiers show.
A patch no test names, or none of whose tests fails, is an error.

This runs pytest once a patch, so it is not a test itself: ``make test-full`` runs it after the tests. Each
run's outcome is kept in the verdict cache keyed by the release, the patches applied, the test code and the
environment (tool/vllm_patch/infrastructure/verdict_cache.py): a warm run takes seconds, and any change to a
patch or a test runs it again.

    python devtools/patch_removal.py [--line NAME ...] [--patch NAME ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

from vllm_patch.engine.analysis import analyze, touched  # noqa: E402
from vllm_patch.engine.patchfile import Patch  # noqa: E402
from vllm_patch.infrastructure.downloads import pinned_base_tree  # noqa: E402
from vllm_patch.infrastructure.verdict_cache import VerdictCache, code_digest  # noqa: E402
from vllm_patch.lines import CURRENT, lines_of  # noqa: E402
from vllm_patch.operations import apply  # noqa: E402
from vllm_patch.series import Series  # noqa: E402
from vllm_patch.targets.tree import TreeTarget  # noqa: E402

V033 = "tests/lines/v0_33"
# The test folders that judge each line. A line that carries the current line's fixes runs the current line's
# tests (for that line: $VLLM_PATCH_V033_LINE) and its own.
JUDGED_BY = {
    CURRENT: (V033,),
    "v0.32": (V033,),
    "v0.27": (V033, "tests/lines/v0_27"),
    "v0.25": (V033, "tests/lines/v0_25"),
    "v0.20": ("tests/lines/v0_20",),
}
JUDGED_ENV = "VLLM_PATCH_JUDGED_PATCH"
TIMEOUT = 900


def slug(name: str) -> str:
    """A patch's name as tests name it: no number, no suffix (0003-turboquant-x.patch: turboquant-x)."""
    return re.sub(r"^\d+-", "", name).removesuffix(".patch")


@dataclass
class Verdict:
    line: str
    patch: str
    left_out: list[str] = field(default_factory=list)  # later patches that need this one
    tests: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    cached: bool = False
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem and self.failed > 0


def without(series: Series, name: str, base: Path) -> tuple[list[Patch], list[str]]:
    """The series less `name`, and less each later patch that no longer applies after it (in memory)."""
    paths = touched(series.patches)
    contents = {p: (base / p).read_bytes() if (base / p).is_file() else None for p in paths}
    kept: list[Patch] = []
    left_out: list[str] = []
    for patch in series.patches:
        if patch.name == name:
            continue
        found = analyze([*kept, patch], contents)
        if found.consistent and found.applied == 0:
            kept.append(patch)
        else:
            left_out.append(patch.name)
    return kept, left_out


def build(base: Path, series: Series, patches: list[Patch], dest: Path) -> Path:
    """`dest` holding the release's vllm/ (and other touched files) with `patches` applied by the tool."""
    shutil.copytree(base / "vllm", dest / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in series.touched_paths():
        if not rel.startswith("vllm/") and (base / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(base / rel, dest / rel)
    apply(TreeTarget(dest), Series(series.pin, tuple(patches)))
    return dest


def run_tests(line: str, judged: str, tree: Path, folders: tuple[str, ...], report: Path) -> dict[str, int]:
    env = {**os.environ, JUDGED_ENV: judged, "VLLM_PATCH_BASE_UNDER_TEST": str(tree),
           "VLLM_PATCH_PATCHED_TREE": str(tree)}
    if line != CURRENT:
        env["VLLM_PATCH_V033_LINE"] = line
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                           *folders], cwd=PROJECT, env=env, capture_output=True, text=True, errors="replace",
                          timeout=TIMEOUT)
    if done.returncode not in (0, 1, 5):
        tail = " ".join((done.stdout + done.stderr).split()[-40:])
        raise RuntimeError(f"pytest exited {done.returncode}: {tail}")
    cases = list(ET.parse(report).getroot().iter("testcase")) if report.is_file() else []
    return {"tests": len(cases), **{k: sum(1 for c in cases if c.find(tag) is not None)
                                    for k, tag in (("failed", "failure"), ("errors", "error"),
                                                   ("skipped", "skipped"))}}


def judge(line: str, series: Series, patch: Patch, base: Path, cache: VerdictCache, work: Path) -> Verdict:
    kept, left_out = without(series, patch.name, base)
    verdict = Verdict(line, patch.name, left_out)
    folders = JUDGED_BY[line]
    h = hashlib.sha256(f"{series.pin.sdist.sha256}\0{line}\0{slug(patch.name)}\0{folders}".encode())
    for p in (*kept, patch):  # the tree, and what it leaves out
        h.update(p.raw)
    key = hashlib.sha256(f"removal\0{h.hexdigest()}\0{code_digest(PROJECT)}".encode()).hexdigest()
    start = time.monotonic()
    hit = cache.get(key)
    if hit is not None:
        counts, verdict.cached = json.loads(hit[1]), True
    else:
        tree = build(base, series, kept, work / f"{line}-{patch.name}")
        try:
            counts = run_tests(line, slug(patch.name), tree, folders, work / f"{line}-{patch.name}.xml")
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        cache.put(key, (counts["failed"] > 0, json.dumps(counts)))
    verdict.tests, verdict.failed = counts["tests"], counts["failed"]
    verdict.errors, verdict.skipped = counts["errors"], counts["skipped"]
    verdict.seconds = round(time.monotonic() - start, 1)
    if not verdict.tests:
        verdict.problem = f"no test in {', '.join(folders)} names it (@pytest.mark.patch({slug(patch.name)!r}))"
    elif not verdict.failed:
        verdict.problem = (f"none of its {verdict.tests} tests fails without it ({verdict.errors} errors, "
                           f"{verdict.skipped} skipped)")
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", action="append", help="only this line (repeatable)")
    parser.add_argument("--patch", action="append", help="only the patches whose name contains this")
    parser.add_argument("--json", type=Path, help="write every verdict here")
    args = parser.parse_args(argv)
    cache = VerdictCache()
    verdicts: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="vllm-patch-removal-") as tmp:
        for line in lines_of(PROJECT):
            if args.line and line.name not in args.line:
                continue
            series = line.load()
            base = pinned_base_tree(series.pin, quiet=True)
            for patch in series.patches:
                if args.patch and not any(p in patch.name for p in args.patch):
                    continue
                try:
                    verdict = judge(line.name, series, patch, base, cache, Path(tmp))
                except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
                    verdict = Verdict(line.name, patch.name, problem=f"could not run: {exc}")
                verdicts.append(verdict)
                mark = "ok  " if verdict.ok else "FAIL"
                extra = f"; also left out: {', '.join(verdict.left_out)}" if verdict.left_out else ""
                print(f"{mark} {line.name:8} {patch.name}: {verdict.failed}/{verdict.tests} of its tests fail "
                      f"without it ({verdict.seconds} s{', cached' if verdict.cached else ''}){extra}"
                      f"{' - ' + verdict.problem if verdict.problem else ''}", flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(v) for v in verdicts], indent=1) + "\n")
    bad = [v for v in verdicts if not v.ok]
    print(f"{len(verdicts) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad or not verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
