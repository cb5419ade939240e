"""``make gpu-fit``: the full compile matrix of the multi-query verify kernel for both release lines, each with
its own Triton (line v0.20: 3.6.0, the current line: 3.8.0), tables to docs/gpu-fit-triton-X.Y.md.

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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--line", choices=sorted(LINES), action="append", help="default: both")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tables-only", action="store_true")
    args = ap.parse_args()
    rc = 0
    with tempfile.TemporaryDirectory() as tmp:
        for line in args.line or ["v0.20", "current"]:
            version = LINES[line][1]
            python = triton_python(version)
            kernel = kernel_file(line, Path(tmp) / line)
            out = cache_dir() / f"results-{line}-triton-{version}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            table = DOCS / f"gpu-fit-triton-{version.rsplit('.', 1)[0]}.md"
            cmd = [str(python), str(HERE / "fitmatrix.py"), "--kernel", str(kernel), "--set", "full", "--jobs",
                   str(args.jobs), "--out", str(out), "--table", str(table), "--line", LABEL[line]]
            if args.tables_only:
                cmd.append("--from-jsonl")
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            print(f"gpu-fit: {LABEL[line]}, Triton {version} -> {table.relative_to(DOCS.parent)}", flush=True)
            rc |= subprocess.run(cmd, env=env).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
