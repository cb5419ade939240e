"""Make the small offline pack for kernel-level runs on a GPU host: no vLLM wheel, only its sources.

The kernel tests and benchmarks load vLLM's Triton files from a source tree (``tests/support/vllm_tree.py``), so
a host with CUDA torch and Triton needs just two trees, a release line's pinned release's ``vllm/*.py`` (line
v0.20 by default, whose kernels tests/lines/v0_20 tests; ``--line current`` for the current line's kernel files,
which run on the host's Triton as line v0.25 runs them) and a copy with the line's series applied, plus the
few wheels vllm-patch imports there and pytest-xdist (a full kernel matrix compiles hundreds of Triton variants:
in parallel, minutes instead of tens of minutes). About 6 MiB of trees and 1 MiB of
wheels; ``gpu/host.sh kernel-pack DIR CMD...`` unpacks it and runs CMD with the trees named.

    python gpu/kernel_pack.py --out .gpu/kt
    python gpu/kernel_pack.py --line current --out .gpu/kt33
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "tool"))
sys.path.insert(0, str(Path(__file__).parent))

from bundle import LINE, TOOL_DEPS, download  # noqa: E402
from vllm_patch.infrastructure.downloads import pinned_base_tree  # noqa: E402
from vllm_patch.lines import line_named  # noqa: E402
from vllm_patch.operations import apply  # noqa: E402
from vllm_patch.targets.tree import TreeTarget  # noqa: E402

TEST_DEPS = ("pytest-xdist==3.8.0", "execnet==2.1.2")


def sources(src: Path, dest: Path) -> None:
    """dest/vllm holding the .py files of src/vllm (the only files the kernel runs read)."""
    for path in src.joinpath("vllm").rglob("*.py"):
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=PROJECT / ".gpu" / "kt")
    parser.add_argument("--line", default=LINE, help=f"the line whose release and series are packed ({LINE})")
    args = parser.parse_args()
    series = line_named(PROJECT, args.line).load()
    base = pinned_base_tree(series.pin, quiet=True)
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sources(base, work / "pristine")
        shutil.copytree(base / "vllm", work / "full" / "vllm")
        if not apply(TreeTarget(work / "full"), series).ok:
            raise SystemExit(f"kernel_pack: line {args.line}'s series does not apply to its pinned release")
        sources(work / "full", work / "patched")
        with tarfile.open(args.out / "trees.tar.xz", "w:xz") as tar:
            tar.add(work / "pristine", "pristine")
            tar.add(work / "patched", "patched")
    names = download(TOOL_DEPS + TEST_DEPS, args.out / "wheels")
    print(f"{args.out}: trees.tar.xz ({(args.out / 'trees.tar.xz').stat().st_size / 2**20:.1f} MiB), "
          f"{len(names)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
