"""Benchmark: `vllm-patch outlook` of one of the project's release lines over every release after its pin
(default line v0.20, pinned to 0.20.0: the releases 0.20.1 to 0.33.0).

Prints figures, asserts nothing. A first, untimed run makes sure every release's PyPI
sdist is downloaded and imported into the cache repository (that can take minutes
once); the timed runs then do what a maintainer's `vllm-patch outlook` does with the
sdists cached: list the releases on the index, detect renames, carry each patch
stacked and alone, check merged results. Each timed run starts a fresh process, so no
in-process cache carries over.

    python benchmarks/bench_outlook.py [--to 0.33.0] [--repeat 5] [--series DIR] [--line NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--to", default="0.33.0", help="the newest release to look at (default 0.33.0)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--series", type=Path, default=HERE.parent, help="the series directory (default: the project)")
    parser.add_argument("--line", default="v0.20", help="the release line (default v0.20; 'current': the top level)")
    args = parser.parse_args()
    common = ["--series", str(args.series), "--line", args.line]
    first, data = _timed(common, args.to)
    releases = [r["version"] for r in data["releases"]]
    newer = [v for v in releases if v != data["pin"]["version"]]
    print(f"outlook of series {data['series']} (pin {data['pin']['version']}): {len(releases)} releases "
          f"({len(newer)} newer: {newer[0]}..{newer[-1]}), {len(data['patches'])} patches, stacked and alone")
    print(f"cpus: {os.cpu_count()}; first run (downloads and imports what is missing): {first:.2f} s")
    times = []
    for i in range(args.repeat):
        seconds, _ = _timed(common, args.to)
        times.append(seconds)
        print(f"  run {i + 1}: {seconds:.2f} s")
    print(f"wall clock, sdists cached, {args.repeat} runs: min {min(times):.2f} s, median "
          f"{statistics.median(times):.2f} s, max {max(times):.2f} s")


def _timed(common: list[str], to: str | None) -> tuple[float, dict]:
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "vllm_patch", *common, "outlook", "--json", *(["--to", to] if to else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"outlook failed ({proc.returncode}): {proc.stderr.strip()}")
    return seconds, json.loads(proc.stdout)


if __name__ == "__main__":
    main()
