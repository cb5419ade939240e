"""Benchmark: rebase series of growing size from vLLM 0.20.0 to 0.21.0, both trees cached.

Prints figures, asserts nothing. The patches mark lines of gdn_attn.py (the same in
both releases) and causal_conv1d.py (changed in 0.21.0), so each is clean or merged.
The first run imports both PyPI sdists into the cache repository (once); the
figures are for the runs after that.

    python benchmarks/bench_rebase.py [--sizes 1,10,30]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from realvllm import CONV, GDN, bench_steps, make_series  # noqa: E402
from vllm_patch.errors import PatchFailed  # noqa: E402
from vllm_patch.infrastructure.downloads import pinned_base_tree  # noqa: E402
from vllm_patch.lifecycle.rebase import Rebaser  # noqa: E402
from vllm_patch.lifecycle.upstream_trees import UpstreamCache  # noqa: E402
from vllm_patch.series import load_series  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,10,30")
    parser.add_argument("--start", type=int, default=300, help="first line the patches mark in each file")
    args = parser.parse_args()
    pin = load_series(HERE.parent / "lines" / "v0.20").pin  # the release (0.20.0) tests/support/realvllm.py edits
    tree = pinned_base_tree(pin)
    cache = UpstreamCache()
    old, new = cache.from_sdist(pin.tag), cache.from_sdist("v0.21.0")
    work = Path(tempfile.mkdtemp(prefix="vllm-patch-bench-rebase-"))
    print(f"rebase {pin.tag} -> v0.21.0, both trees cached")
    print(f"{'patches':>8} {'seconds':>8} {'ms/patch':>9}  outcome")
    try:
        for n in [int(s) for s in args.sizes.split(",")]:
            base, steps = bench_steps(tree, n, start=args.start, files=(GDN, CONV))
            root = make_series(work / f"s{n}", base, steps)
            rebaser = Rebaser(root, load_series(root), cache)
            start = time.perf_counter()
            try:
                result = rebaser.start("v0.21.0", old, new)
                outcome = collections.Counter(o.step.value for o in result.outcomes)
            except PatchFailed as exc:
                outcome = collections.Counter(o.step.value for o in exc.result.outcomes)
            seconds = time.perf_counter() - start
            print(f"{n:>8} {seconds:>8.2f} {seconds * 1000 / n:>9.0f}  {dict(outcome)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
