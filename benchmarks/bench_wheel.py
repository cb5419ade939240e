"""Benchmark: build-wheel from the cached upstream wheel, against copying that file.

Copying the 244 MB wheel is the physical floor of any tool that writes a new wheel
of the same size. Prints figures, asserts nothing.

    python benchmarks/bench_wheel.py [--patches 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from realvllm import bench_steps, make_series  # noqa: E402
from vllm_patch.artifacts.wheel import build_wheel  # noqa: E402
from vllm_patch.infrastructure.downloads import fetch, pinned_base_tree  # noqa: E402
from vllm_patch.series import load_series  # noqa: E402


def median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--patches", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pin = load_series(HERE.parent / "lines" / "v0.20").pin  # the release (0.20.0) tests/support/realvllm.py edits
    wheel = fetch(pin.wheel)
    work = Path(tempfile.mkdtemp(prefix="vllm-patch-bench-wheel-"))
    try:
        base, steps = bench_steps(pinned_base_tree(pin), args.patches)
        series = load_series(make_series(work / "series", base, steps))
        copy_s = median_s(lambda: shutil.copyfile(wheel, work / "copy.whl"), args.repeat)
        build_s = median_s(lambda: build_wheel(series, wheel, work / "dist", verified=True), args.repeat)
        checked_s = median_s(lambda: build_wheel(series, wheel, work / "dist"), args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = wheel.stat().st_size / 1e6
    print(f"upstream wheel: {wheel.name}, {size:.0f} MB; series: {args.patches} patches; median of {args.repeat}")
    print(f"  copy the wheel (floor)                 {copy_s:6.2f} s   1.00x")
    print(f"  build-wheel (sha256 already checked)   {build_s:6.2f} s   {build_s / copy_s:.2f}x")
    print(f"  build-wheel + sha256 of the source     {checked_s:6.2f} s   {checked_s / copy_s:.2f}x")


if __name__ == "__main__":
    main()
