"""`python -m harness run|report|list`: the GPU scenario runner's command line.

Run it with tests/gpu on PYTHONPATH, with an interpreter that has torch,
transformers and vLLM's dependencies; the vLLM trees are given by path.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

from . import report, runner
from .scenarios import SCENARIOS, select
from .serve import stack


def _trees(values: list[str]) -> dict[str, Path]:
    trees = {}
    for v in values:
        label, sep, path = v.partition("=")
        if not sep or not (Path(path) / "vllm" / "__init__.py").is_file():
            raise SystemExit(f"--tree wants LABEL=DIR with DIR/vllm/__init__.py; got {v!r}")
        trees[label] = Path(path).resolve()
    return trees


def portable_command(argv: list[str]) -> str:
    """The command as `python -m harness ...`, without --out: where this machine keeps the
    harness and writes the report does not matter to rerunning it."""
    args, skip = [], False
    for a in argv[1:]:
        if skip or a.startswith("--out="):
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        args.append(a)
    return " ".join(["python", "-m", "harness", *map(shlex.quote, args)])


def _meta(args: argparse.Namespace, wall: float | None) -> dict:
    meta = {"title": args.title, "command": portable_command(sys.argv),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version()}
    # Only the process that ran the engines knows their stack: `report` rewrites results brought back from a GPU
    # host, where this process's torch and device are not theirs (the bundle note says what they ran on).
    if args.cmd == "run":
        try:
            meta.update(stack())
        except ImportError:
            pass
    if args.bundle_note:
        meta["bundle"] = args.bundle_note
    if wall is not None:
        meta["wall_s"] = round(wall, 1)
    return meta


def _write(args: argparse.Namespace, judgements: list[report.Judgement], wall: float | None) -> None:
    meta = _meta(args, wall)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report.to_json(judgements, meta), indent=1) + "\n")
    md = report.to_markdown(judgements, meta)
    (out / f"{args.name}.md").write_text(md)
    print(md)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the scenarios")
    for name in ("run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--tree", action="append", required=True, help="LABEL=DIR, DIR holding vllm/")
        p.add_argument("--work", default="/tmp/vllm-patch-gpu", help="models, engine results and caches")
        p.add_argument("--scenarios", default=None, help="comma-separated names or prefixes (default: all)")
        p.add_argument("--out", default=".", help="where REPORT.json and REPORT.md go")
        p.add_argument("--name", default="report", help="report file name without extension")
        p.add_argument("--title", default="vLLM 0.20.0")
        p.add_argument("--bundle-note", default="", help="a line saying what the vLLM trees are")
        if name == "run":
            p.add_argument("--path", action="append", default=[], help="extra PYTHONPATH entries (dependencies)")
            p.add_argument("--timeout", type=float, default=420.0, help="seconds per engine")
            p.add_argument("--jobs", type=int, default=1, help="engines at once (each takes its share of GPU memory)")
            p.add_argument("--fresh", action="store_true", help="rerun engines that already have a result")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for s in SCENARIOS:
            fixed = f"; fixed by {', '.join(s.fixed_by)}" if s.fixed_by else ""
            print(f"{s.name:28} {s.title}\n{'':28} unpatched: {s.unpatched}{fixed}")
        return 0
    trees = _trees(args.tree)
    try:
        scenarios = select(args.scenarios)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    work = Path(args.work)
    started = time.perf_counter()
    if args.cmd == "run":
        results = runner.run(scenarios, trees, work, [Path(p) for p in args.path], args.timeout, args.jobs,
                             args.fresh)
    else:
        results = runner.load(scenarios, trees, work)
    wall = time.perf_counter() - started if args.cmd == "run" else None
    _write(args, runner.judge_all(scenarios, results), wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
