"""Benchmark: check, apply and revert on the real vLLM 0.20.0, as the series grows.

Prints figures and asserts nothing. Baseline in the same run: ``git apply`` of the
same patches on a copy of the same tree (no anchor-uniqueness check, no journal).

    python benchmarks/bench_core.py [--sizes 1,10,30,100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from realvllm import bench_steps, make_series, make_venv  # noqa: E402
from vllm_patch import operations  # noqa: E402
from vllm_patch.infrastructure.downloads import cache_root, fetch, pinned_base_tree  # noqa: E402
from vllm_patch.series import load_series  # noqa: E402
from vllm_patch.targets import SitePackagesTarget, TreeTarget  # noqa: E402
from vllm_patch.targets.site_packages import site_packages_of  # noqa: E402


def best(fn, repeat: int) -> float:
    """Median wall time of `fn` in milliseconds."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,10,30,100")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    console = Console()
    pin = load_series(HERE.parent / "lines" / "v0.20").pin  # the release (0.20.0) tests/support/realvllm.py edits
    tree = pinned_base_tree(pin)
    venv = cache_root() / "bench-venv"
    if not (venv / "bin/python").exists():
        console.print("creating a venv with the real vLLM 0.20.0 wheel (once)...")
        make_venv(venv, fetch(pin.wheel))
    site = SitePackagesTarget(site_packages_of(str(venv / "bin/python")))
    work = Path(tempfile.mkdtemp(prefix="vllm-patch-bench-"))
    table = Table(title=f"vllm-patch on real vLLM {pin.version} (median of {args.repeat}, ms)")
    for col in ("patches", "hunks", "check", "apply+revert site-packages", "CLI apply+revert",
                "git apply (baseline)", "apply+revert / git apply"):
        table.add_column(col, justify="right")
    try:
        for n in sizes:
            base, steps = bench_steps(tree, n)
            sdir = make_series(work / f"s{n}", base, steps)
            series = load_series(sdir)
            hunks = sum(len(f.hunks) for p in series.patches for f in p.files)
            check_ms = best(lambda s=series: operations.check(TreeTarget(tree), s), args.repeat)

            def round_trip(s=series):
                operations.apply(site, s)
                operations.revert(site, s)
            rt_ms = best(round_trip, args.repeat)

            def cli_round_trip(d=sdir, py=str(venv / "bin/python")):
                for cmd in ("apply", "revert"):
                    subprocess.run([sys.executable, "-m", "vllm_patch", "--series", str(d), cmd, "--python", py,
                                    "--json"], check=True, capture_output=True)
            cli_ms = best(cli_round_trip, max(1, args.repeat // 2))
            copy = work / f"tree{n}"
            for rel in base:
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tree / rel, copy / rel)
            patches = sorted(str(p) for p in (sdir / "patches").glob("*.patch"))

            def git_apply(p=patches, cwd=copy):
                subprocess.run(["git", "apply", *p], cwd=cwd, check=True)
                subprocess.run(["git", "apply", "-R", *reversed(p)], cwd=cwd, check=True)
            git_ms = best(git_apply, args.repeat)
            table.add_row(str(n), str(hunks), f"{check_ms:.0f}", f"{rt_ms:.0f}", f"{cli_ms:.0f}",
                          f"{git_ms:.0f}", f"{rt_ms / git_ms:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    console.print(table)
    console.print("check: parse the series, read the touched files of the pristine sdist tree, locate "
                  "every anchor, apply in memory, and re-recognise the result.\n"
                  "apply+revert: in-process, each under lock and journal, with RECORD checks and "
                  "rewrites. CLI: the same as two `vllm-patch` processes (Python start-up included).")


if __name__ == "__main__":
    main()
