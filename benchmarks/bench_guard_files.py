"""Benchmark: the guard's start-up check (``vllm_patch_guard.check``) on the real vLLM 0.33.0 layout with the
current line applied, without a virtualenv: the pinned wheel's dist-info, ``vllm/_version.py`` and the files the
line touches are extracted into a directory (the wheel is downloaded once and cached), the tool applies the line
there, and fresh interpreters with that directory and the guard's source (with its generated ``lines.json``) on
their path time ``check()`` as vLLM's plugin loader calls it, importlib.metadata, hashlib and json already
imported: the first call of each process (what a vLLM start pays), then more calls in the same process. Prints
min/median/max in milliseconds over --starts processes after --warmup ones; asserts nothing.

    python benchmarks/bench_guard_files.py [--starts 7] [--calls 20] [--warmup 2] [--baseline REV]

--baseline REV also times the guard's source at git revision REV (e.g. HEAD~1) on the same tree, the two
alternating process by process, so a busy machine weighs on both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import py_compile
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent
sys.path.insert(0, str(PROJECT / "tests" / "guard"))

from guardenv import GUARD, guard_setup  # noqa: E402

# What a vLLM process has imported before its plugin loader calls the guard: importlib.metadata (the loader
# finds the entry points with it), hashlib and json.
CHILD = """
import importlib.metadata, hashlib, json, sys, time
t0 = time.perf_counter()
import vllm_patch_guard
imported = time.perf_counter() - t0
times = []
for _ in range(int(sys.argv[1]) + 1):
    t0 = time.perf_counter()
    vllm_patch_guard.check()
    times.append(time.perf_counter() - t0)
print(json.dumps({"import_ms": imported * 1e3, "calls_ms": [t * 1e3 for t in times]}))
"""


def site_with_the_line(dest: Path) -> Path:
    """The pinned wheel's dist-info, version file and touched files, with the current line applied by the tool."""
    from vllm_patch import operations
    from vllm_patch.engine.analysis import touched
    from vllm_patch.infrastructure.downloads import fetch
    from vllm_patch.lines import line_named
    from vllm_patch.targets import SitePackagesTarget

    series = line_named(PROJECT, "current").load()
    wanted = set(touched(list(series.patches))) | {"vllm/_version.py"}
    with zipfile.ZipFile(fetch(series.pin.wheel, quiet=True)) as zf:
        for name in zf.namelist():
            if name in wanted or ".dist-info/" in name:
                zf.extract(name, dest)
    outcome = operations.apply(SitePackagesTarget(dest), series)
    assert outcome.ok, outcome.verdict
    return dest


def guard_copy(dest: Path, rev: str | None = None) -> Path:
    """The guard's source package (this checkout's, or at git revision `rev`) with the ``lines.json`` its
    build would generate from this checkout."""
    package = dest / "vllm_patch_guard"
    package.mkdir(parents=True)
    source = GUARD / "src" / "vllm_patch_guard" / "__init__.py"
    text = source.read_bytes() if rev is None else subprocess.run(
        ["git", "show", f"{rev}:guard/src/vllm_patch_guard/__init__.py"], cwd=PROJECT, check=True,
        capture_output=True).stdout
    (package / "__init__.py").write_bytes(text)
    (package / "lines.json").write_bytes(guard_setup().lines_data(PROJECT))
    # Bytecode, as pip's install compiles it (even where $PYTHONDONTWRITEBYTECODE keeps imports from doing so).
    py_compile.compile(str(package / "__init__.py"), doraise=True)
    return dest


def summary(values: list[float]) -> str:
    return f"min {min(values):.3f} / median {statistics.median(values):.3f} / max {max(values):.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=7, help="fresh processes timed (after --warmup)")
    parser.add_argument("--calls", type=int, default=20, help="further calls of check() timed in each process")
    parser.add_argument("--warmup", type=int, default=2, help="processes run first and not counted")
    parser.add_argument("--baseline", metavar="REV", help="also time the guard of this git revision")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-guard-files-") as tmp:
        site = site_with_the_line(Path(tmp) / "site")
        guards = {"this checkout": guard_copy(Path(tmp) / "guard")}
        if args.baseline:
            guards[args.baseline] = guard_copy(Path(tmp) / "baseline", args.baseline)
        runs: dict[str, list[dict]] = {label: [] for label in guards}
        for i in range(args.warmup + args.starts):
            for label, path in guards.items():
                env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PATCH_GUARD")}
                env.update(PYTHONPATH=f"{path}{os.pathsep}{site}", VLLM_PATCH_GUARD="strict")
                done = subprocess.run([sys.executable, "-c", CHILD, str(args.calls)], env=env, check=True,
                                      capture_output=True, text=True)
                if i >= args.warmup:
                    runs[label].append(json.loads(done.stdout))
        state = json.loads(next(site.glob("vllm-*.dist-info/vllm_patch.json")).read_text())
        print(f"vLLM 0.33.0 with the current line applied ({len(state['record'])} files changed), guard strict, "
              f"{args.starts} processes each after {args.warmup} warm-up:")
        for label, found in runs.items():
            print(f"{label}:")
            print(f"  first check() of a process:  {summary([r['calls_ms'][0] for r in found])}")
            print(f"  later calls ({args.calls} a process): {summary([t for r in found for t in r['calls_ms'][1:]])}")
            print(f"  import of the guard:         {summary([r['import_ms'] for r in found])}")


if __name__ == "__main__":
    main()
