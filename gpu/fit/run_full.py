"""``make gpu-fit``: the compile matrix of the multi-query verify kernel for both release lines, each under the
Tritons its releases run: line v0.20 under 3.6.0, the current line's kernel (the same file in lines v0.25, v0.27,
v0.32 and v0.33) under 3.6.0 (vLLM 0.25: torch 2.11), 3.7.1 (vLLM 0.27 to 0.32: torch 2.13) and 3.8.0 (vLLM 0.33).
Tables: docs/gpu-fit-triton-3.6.md (line v0.20) and docs/gpu-fit-current-triton-X.Y.md (the current line);
``--set reduced`` writes docs/gpu-fit-current-triton-X.Y-reduced.md (fitmatrix.REDUCED).

Compiles are cached (fitmatrix.cache_dir()), so a second run only re-plans; ``--tables-only`` writes the tables
from what an earlier, perhaps interrupted, run finished.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fitmatrix import cache_dir  # noqa: E402
from fitsupport import HERE, LINES, kernel_file, triton_python  # noqa: E402

DOCS = HERE.parents[1] / "docs"
LABEL = {"v0.20": "line v0.20, vLLM 0.20.0", "current": "the current line, vLLM 0.33.0"}
# The Tritons each line's releases pin (gpu/requires/, tests/gpu/test_stack_bundle.py): the current line's
# kernel runs in vLLM 0.25 (torch 2.11: Triton 3.6.0), 0.27 and 0.32 (torch 2.13: 3.7.1) and 0.33 (3.8.0).
TRITONS = {"v0.20": ("3.6.0",), "current": ("3.6.0", "3.7.1", "3.8.0")}
RELEASES = {("current", "3.6.0"): "as line v0.25 runs it: vLLM 0.25, torch 2.11",
            ("current", "3.7.1"): "as lines v0.27 and v0.32 run it: vLLM 0.27 and 0.32, torch 2.13",
            ("current", "3.8.0"): "as the current line runs it: vLLM 0.33, torch 2.14"}


def table_path(line: str, version: str, set_name: str = "full") -> Path:
    """docs/gpu-fit-triton-3.6.md for line v0.20; docs/gpu-fit-current-triton-X.Y[-reduced].md for the current
    line."""
    minor = version.rsplit(".", 1)[0]
    name = f"gpu-fit-triton-{minor}" if line == "v0.20" else f"gpu-fit-current-triton-{minor}"
    return DOCS / (name + ("" if set_name == "full" else f"-{set_name}") + ".md")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--line", choices=sorted(LINES), action="append", help="default: both")
    ap.add_argument("--triton", action="append", help="only these Triton versions (default: each line's)")
    ap.add_argument("--set", choices=("full", "reduced"), default="full")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tables-only", action="store_true")
    args = ap.parse_args()
    rc = 0
    with tempfile.TemporaryDirectory() as tmp:
        for line in args.line or ["v0.20", "current"]:
            kernel = kernel_file(line, Path(tmp) / line)
            for version in TRITONS[line]:
                if args.triton and version not in args.triton:
                    continue
                python = triton_python(version)
                suffix = "" if args.set == "full" else f"-{args.set}"
                out = cache_dir() / f"results-{line}-triton-{version}{suffix}.json"
                out.parent.mkdir(parents=True, exist_ok=True)
                table = table_path(line, version, args.set)
                label = (f"the current line's kernel {RELEASES[line, version]}" if (line, version) in RELEASES
                         else LABEL[line])
                cmd = [str(python), str(HERE / "fitmatrix.py"), "--kernel", str(kernel), "--set", args.set,
                       "--jobs", str(args.jobs), "--out", str(out), "--table", str(table), "--line", label]
                if args.tables_only:
                    cmd.append("--from-jsonl")
                env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
                print(f"gpu-fit: {label}, Triton {version} -> {table.relative_to(DOCS.parent)}", flush=True)
                rc |= subprocess.run(cmd, env=env).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
