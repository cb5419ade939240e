"""Benchmark: what the guard (guard/, vllm-patch-guard) costs at vLLM's start.

In a virtualenv with the real vLLM 0.33.0 wheel (``--no-deps``) and the guard's wheel, vLLM's own plugin loader
(tests/guard/vllm_start.py) loads the guard's entry point; its call is timed (first call, then the median of
--runs more), unpatched (it warns) and with the series applied (silent, the steady state), and
``python -X importtime -c 'import vllm_patch_guard'`` gives the import of the guard's module in a bare
interpreter, and its import where vLLM's loader imports it is timed in --starts processes. Prints figures
and asserts nothing.

    python benchmarks/bench_guard.py [--runs 20] [--starts 10] [--python VENV/bin/python]

Without --python it builds the virtualenv (the vLLM wheel is downloaded once and cached) and the guard's wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "guard"))

from guardenv import PROJECT, START, build_wheel, copy_repository, make_vllm_venv, put  # noqa: E402


def importtime(py: Path) -> tuple[int, int]:
    """(self, cumulative) microseconds of ``import vllm_patch_guard`` (hashlib, which it imports, included: a
    real vLLM process has it already). Measured on its own: vLLM's loader imports it with
    importlib.import_module, which ``-X importtime`` does not report."""
    err = subprocess.run([str(py), "-X", "importtime", "-c", "import vllm_patch_guard"], capture_output=True,
                         text=True, check=True).stderr
    for line in err.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == "vllm_patch_guard":
            return int(parts[0]), int(parts[1])
    raise SystemExit("vllm_patch_guard is not in the importtime output")


def bench(py: Path, runs: int, *preload: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PATCH_GUARD")}
    env["VLLM_PLUGINS"] = "vllm_patch_guard"
    out = subprocess.run([str(py), str(START), "--bench", str(runs), *preload], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def import_ms(py: Path, starts: int, *preload: str) -> float:
    """The median over `starts` fresh processes of the guard's import in vLLM's loader."""
    return statistics.median([bench(py, 0, *preload)["import_ms"] for _ in range(starts)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="calls of the entry point timed in one process")
    parser.add_argument("--starts", type=int, default=10, help="processes whose import of the guard is timed")
    parser.add_argument("--python", type=Path, help="a virtualenv's interpreter with vLLM 0.33.0 and the guard")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmp:
        py = args.python
        if py is None:
            repo = copy_repository(Path(tmp) / "repo")
            py = make_vllm_venv(Path(tmp) / "venv", build_wheel(repo / "guard", Path(tmp) / "dist"))
        for label, series in (("unpatched (warns)", None), ("patched (silent)", PROJECT)):
            put(py, series)
            figures = bench(py, args.runs)
            print(f"{label}: the guard's entry point called by vLLM's loader: first call "
                  f"{figures['first_call_ms']:.2f} ms, median of the next {args.runs} "
                  f"{figures['median_call_ms']:.2f} ms")
        own, total = importtime(py)
        print(f"python -X importtime -c 'import vllm_patch_guard': {own} us self, {total} us cumulative "
              "(a bare interpreter: json and hashlib included)")
        print(f"its import where vLLM's loader imports it, median of {args.starts} starts: "
              f"{import_ms(py, args.starts):.2f} ms, adding the modules {', '.join(figures['added_modules'])}; "
              f"{import_ms(py, args.starts, 'hashlib'):.2f} ms with hashlib already imported (as in a real vLLM "
              f"process); torch imported: {figures['torch_imported']}")
        put(py)


if __name__ == "__main__":
    main()
