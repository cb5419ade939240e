"""vLLM's own style on what a line changes: ``ruff format --check`` and ``ruff check``, with the ruff version the
pinned release's ``.pre-commit-config.yaml`` names and the release's own ``pyproject.toml``, on every file the
line's patches add or change, in the patched tree and in the release. A file that passes in the release and fails
patched is the line's to fix (exit status 1); one the release itself leaves failing is reported and not counted.

That ruff is installed once into a virtualenv of its own under the tool's cache (``tools/ruff-VERSION``), never
into this project's environment.

    python devtools/vllm_ruff.py [--line NAME ...]     # default: every line
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tool"))

from vllm_patch import operations  # noqa: E402
from vllm_patch.infrastructure.downloads import cache_root, pinned_base_tree  # noqa: E402
from vllm_patch.lines import line_named, lines_of  # noqa: E402
from vllm_patch.targets.tree import TreeTarget  # noqa: E402


def ruff_version(tree: Path) -> str:
    """The ruff release the tree's pre-commit configuration pins (``rev: vX.Y.Z`` after ruff-pre-commit)."""
    text = (tree / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    found = re.search(r"astral-sh/ruff-pre-commit\s*\n\s*rev:\s*v?([\w.]+)", text)
    if not found:
        raise SystemExit(f"{tree}/.pre-commit-config.yaml names no ruff-pre-commit rev")
    return found.group(1)


def ruff(version: str) -> Path:
    """That ruff's executable, installed once into its own virtualenv in the tool's cache."""
    home = cache_root() / "tools" / f"ruff-{version}"
    exe = home / "bin" / "ruff"
    if not exe.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
        subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        f"ruff=={version}"], check=True)
    return exe


def failures(exe: Path, tree: Path, paths: list[str]) -> dict[str, list[str]]:
    """Per path present in `tree` and ending in .py: which of 'format' and 'check' it fails."""
    out: dict[str, list[str]] = {}
    for rel in paths:
        if not rel.endswith(".py") or not (tree / rel).is_file():
            continue
        failed = []
        if subprocess.run([str(exe), "format", "--check", "--quiet", rel], cwd=tree).returncode:
            failed.append("format")
        if subprocess.run([str(exe), "check", "--quiet", "--no-cache", rel], cwd=tree,
                          stdout=subprocess.DEVNULL).returncode:
            failed.append("check")
        out[rel] = failed
    return out


def check_line(name: str, project: Path = ROOT) -> list[str]:
    """The line's files that pass vLLM's ruff in its release and fail it patched, as 'path: format, check'."""
    series = line_named(project, name).load()
    base = pinned_base_tree(series.pin, quiet=True)
    exe = ruff(ruff_version(base))
    paths = list(series.touched_paths())
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "vllm"
        shutil.copytree(base, tree, ignore=shutil.ignore_patterns("__pycache__"))
        if not operations.apply(TreeTarget(tree), series).ok:
            raise SystemExit(f"line {name} does not apply to vLLM {series.pin.version}: run vllm-patch check")
        patched = failures(exe, tree, paths)
    release = failures(exe, base, paths)
    bad = []
    for rel, failed in patched.items():
        own = [f for f in failed if f not in release.get(rel, [])]
        inherited = [f for f in failed if f in release.get(rel, [])]
        if inherited:
            print(f"  {name}: {rel}: {', '.join(inherited)} fails in vLLM {series.pin.version} itself (not counted)")
        if own:
            bad.append(f"{rel}: {', '.join(own)}")
    print(f"{name} (vLLM {series.pin.version}, ruff {exe.parent.parent.name.removeprefix('ruff-')}): "
          f"{len(patched)} files, {len(bad)} the line leaves failing" + "".join(f"\n  {b}" for b in bad))
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", action="append", help="a line's name (repeatable; default: every line)")
    args = parser.parse_args(argv)
    names = args.line or [line.name for line in lines_of(ROOT)]
    bad = [b for name in names for b in check_line(name)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
