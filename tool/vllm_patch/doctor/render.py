"""The doctor's findings as text (rich) and as JSON for an issue.

The JSON holds no path of the user's machine beyond those the user gave (``--python``, ``--target``,
``--model``): the vLLM's directory, the tool's, the home directory and any other absolute path in a
message are replaced by a placeholder."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import __version__
from ..report import print_table
from . import Diagnosis

SCHEMA = 1
# An absolute path in free text: a slash, then at least one more path component.
_PATH = re.compile(r"(?<![\w.:/~>-])/(?:[\w.+@-]+/)+[\w.+@-]*")
STATE_STYLE = {"applied": "green", "applies": "cyan"}


def _kib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024:g} KiB"


class Scrubber:
    """Replaces the machine's paths in strings: the known ones by a name, the rest by ``<path>``; the paths
    the user gave stay as given."""

    def __init__(self, known: dict[str, str], given: list[str]) -> None:
        pairs = {}
        for path, name in known.items():
            if path and path not in ("/", "."):
                pairs[str(path)] = name
                pairs[str(Path(path).resolve())] = name
        # Longest first; a path only where it ends (not /home/me in /home/mei).
        self.known = [(re.compile(re.escape(path) + r"(?![\w.+@-])"), name)
                      for path, name in sorted(pairs.items(), key=lambda item: -len(item[0]))]
        self.given = [g for g in given if g]

    def text(self, value: str) -> str:
        kept = {f"\0{i}\0": g for i, g in enumerate(self.given)}
        for mark, g in kept.items():
            value = value.replace(g, mark)
        for path, name in self.known:
            value = path.sub(name, value)
        value = _PATH.sub("<path>", value)
        for mark, g in kept.items():
            value = value.replace(mark, g)
        return value

    def __call__(self, data: Any) -> Any:
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: self(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self(v) for v in data]
        return data


def scrubber(found: Diagnosis, home_root: Path) -> Scrubber:
    known = {str(found.root): "<vllm>", sys.executable: "<vllm-patch's python>", sys.prefix: "<vllm-patch's prefix>",
             str(home_root): "<series>", str(Path(__file__).resolve().parents[1]): "<vllm_patch>",
             os.path.expanduser("~"): "~"}
    return Scrubber(known, [found.python or "", found.target or "", found.model_dir or ""])


def to_dict(found: Diagnosis) -> dict:
    """Everything, as the JSON prints it (before scrubbing)."""
    inst = found.install
    return {
        "doctor": SCHEMA,
        "vllm_patch": __version__,
        "exit_code": found.exit_code,
        "verdict": verdict(found),
        "given": {"python": found.python, "target": found.target, "model": found.model_dir,
                  "interpret": found.interpret, "assumed_limits": found.assumed},
        "install": {
            "vllm": {"version": inst.version, "commit": inst.commit, "where": inst.where},
            "line": inst.line, "line_note": inst.line_note, "pin": inst.pin, "series": inst.digest,
            "verdict": inst.verdict, "fully_applied": inst.fully_applied, "fix": inst.fix,
            "patches": inst.patches, "record_problems": inst.integrity, "notes": inst.notes,
            "kernel_installed": inst.kernel_installed, "guard": inst.guard, "env": inst.env,
        },
        "runtime": found.runtime,
        "gpus": found.gpus,
        "no_gpu": no_gpu_line(found),
        "model": {"name": found.model.name, "dtype": found.model.dtype,
                  "geometries": [g.to_dict() for g in found.model.geometries]},
        "skipped": found.skipped,
        "routes": [{**table, "kernel_for_k": kernel_for_k(table["rows"])} for table in found.routes],
        "check": {"k1": found.check_k1, "results": found.checks, "ok": not found.kernel_failed
                  if (found.checks or found.errors) else None},
        "timing": found.timings,
        "errors": found.errors,
    }


def kernel_for_k(rows: list[dict]) -> list[dict]:
    """Per (G, head dim, preset): the numbers of speculative tokens K for which vLLM takes the kernel. It
    decides once for K+1 = 1 (decodes) and K+1 = 1 + K (verify batches) together: both need tiles."""
    routed = {(r["group"], r["head_dim"], r["preset"], r["k1"]): r["route"] == "multi-query" for r in rows}
    out = []
    for group, head_dim, preset in dict.fromkeys((r["group"], r["head_dim"], r["preset"]) for r in rows):
        key = (group, head_dim, preset)
        k1s = sorted(k1 for (*rest, k1) in routed if tuple(rest) == key)
        ks = [k1 - 1 for k1 in k1s if routed.get((*key, 1)) and routed[(*key, k1)]]
        out.append({"group": group, "head_dim": head_dim, "preset": preset, "k": ks, "of": [k1 - 1 for k1 in k1s]})
    return out


def no_gpu_line(found: Diagnosis) -> str | None:
    if not found.no_gpu:
        return None
    return f"no GPU visible to {found.python or 'this interpreter'} ({found.no_gpu})"


def verdict(found: Diagnosis) -> str:
    inst = found.install
    said = []
    if not inst.fully_applied:
        # Patches in a state apply cannot move on (files edited since): a fresh vLLM first.
        first = "" if inst.ok else "reinstall vLLM, then "
        said.append(f"the line is not fully applied ({inst.verdict}): {first}run {inst.fix}")
    if found.kernel_failed:
        said.append("the line's kernel gave a wrong result or failed to run")
    if said:
        return "; and ".join(said)
    if found.environment_error:
        return "the interpreter could not be examined"
    if inst.line is None:
        return "no release line covers this vLLM"
    if not found.checks:
        return "the line is applied; no kernel was checked (no GPU)" if found.no_gpu and not found.interpret \
            else "the line is applied"
    return "the line is applied and its kernel checks out"


# --------------------------------------------------------------------------- text


def _env_value(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def print_text(found: Diagnosis, out: Console) -> None:
    inst = found.install
    commit = f" (commit {inst.commit})" if inst.commit else ""
    out.print(f"vLLM {inst.version or '(unknown version)'}{commit}, {inst.where}", markup=False)
    if inst.line is None:
        for note in inst.notes:
            out.print(f"[yellow]note[/]: {escape(note)}")
    else:
        applied = sum(1 for p in inst.patches if p["state"] == "applied")
        out.print(f"release line {inst.line} (pinned to vLLM {inst.pin}, series {inst.digest}): "
                  f"[{STATE_STYLE.get(inst.verdict or '', 'red')}]{inst.verdict}[/] "
                  f"({applied} of {len(inst.patches)} patches applied)")
        for p in inst.patches:
            out.print(f"  [{STATE_STYLE.get(p['state'], 'red')}]{p['state']:>8}[/]  {escape(p['name'])}")
        for problem in inst.integrity:
            out.print(f"  [red]RECORD[/]: {escape(problem)}")
        for note in inst.notes:
            out.print(f"[yellow]note[/]: {escape(note)}")
    g = inst.guard
    if g.get("installed"):
        knows = {True: ", knows this series", False: ", built for another series (reinstall it)"}.get(
            g.get("knows_series"), "")
        out.print(f"guard: vllm-patch-guard {g.get('version')}{knows}; mode {g['mode']}")
    else:
        out.print(f"guard: not installed (mode {g.get('mode')} if it were)")
    out.print("environment: " + ", ".join(f"{k}={_env_value(v)}" for k, v in inst.env.items()), markup=False)
    rt = found.runtime
    if rt:
        gpu_stack = f"CUDA {rt['cuda']}" if rt.get("cuda") else f"ROCm/HIP {rt['hip']}" if rt.get("hip") else "CPU"
        driver = f", driver {rt['driver']}" if rt.get("driver") else ""
        out.print(f"runtime: Python {rt['python']}, torch {rt['torch']} ({gpu_stack}), Triton {rt.get('triton')}"
                  f"{driver}", markup=False)
    for d in found.gpus:
        arch = f"sm_{d['capability'].replace('.', '')}" if d.get("capability") else d.get("arch") or "?"
        out.print(f"GPU {d['index']}: {d['name']}, {arch}, {_kib(d['max_shared'])} shared memory per block "
                  f"({d['max_shared']} B, opt-in), {d['sm_count']} SMs", markup=False)
    line = no_gpu_line(found)
    if line:
        out.print(f"[yellow]{escape(line)}[/]")
    if found.skipped:
        out.print(f"[yellow]note[/]: {escape(found.skipped)}")
    for table in found.routes:
        _print_routes(found, table, out)
    _print_checks(found, out)
    for error in found.errors:
        out.print(f"[red]error[/] ({error['stage']}): {escape(error['message'])}")
    code = found.exit_code
    word = "[green]OK[/]" if code == 0 else "[red]FAILED[/]" if code == 1 else "[red]ERROR[/]"
    out.print(f"{word}: {escape(verdict(found))}")


def _where(found: Diagnosis, table: dict) -> str:
    device = table["device"]
    limits = table.get("limits")
    if device == "cpu":
        return "the CPU (Triton interpreter: no device limits, the widest tiles)"
    if device == "assumed":
        return f"an assumed device (capability {limits['capability']}, {limits['max_shared']} B per block)"
    cap = f", {limits['max_shared']} B per block" if limits else ""
    return f"GPU {device}{cap}"


def _print_routes(found: Diagnosis, table: dict, out: Console) -> None:
    for group, head_dim in dict.fromkeys((r["group"], r["head_dim"]) for r in table["rows"]):
        who = ", ".join(f"TP={g.tp} {g.num_heads}/{g.num_kv_heads}" for g in found.model.geometries
                        if (g.group, g.head_dim) == (group, head_dim))
        t = Table(title=f"route on {_where(found, table)}: {found.model.name}, G={group} D={head_dim} ({who})",
                  title_justify="left")
        for col in ("preset", "K+1", "route", "BLOCK_M x tiles", "BLOCK_N", "scores", "staged shared"):
            t.add_column(col)
        t.add_column("why / refused first", overflow="fold")
        for r in table["rows"]:
            if (r["group"], r["head_dim"]) != (group, head_dim):
                continue
            if r["route"] == "multi-query":
                route = "[green]multi-query[/]" + ("" if r.get("confirmed") else " (planned)")
                t.add_row(r["preset"], str(r["k1"]), route, f"{r['block_m']} x {r['m_tiles']}", str(r["block_n"]),
                          r["precision"], f"{r['shared']} B", escape("; ".join(r.get("refused") or [])))
            else:
                t.add_row(r["preset"], str(r["k1"]), "[yellow]release[/]", "", "", "", "", escape(r.get("why") or ""))
        print_table(t, out)
        for entry in kernel_for_k(table["rows"]):
            if (entry["group"], entry["head_dim"]) != (group, head_dim) or entry["k"] == entry["of"]:
                continue
            takes = ", ".join(map(str, entry["k"])) or "none"
            out.print(f"  {entry['preset']}: vLLM takes the kernel with K = {takes} speculative tokens "
                      f"(of {', '.join(map(str, entry['of']))}); otherwise the release's routes", markup=False)


def _print_checks(found: Diagnosis, out: Console) -> None:
    if not found.checks:
        return
    first = found.checks[0]
    hq, hk, d = first["heads"]
    where = "the CPU (interpreter)" if first["device"] == "cpu" else f"GPU {first['device']}"
    t = Table(title=f"kernel check on {where}: {hq}/{hk} heads of {d}, K+1={found.check_k1}, float64 reference",
              title_justify="left")
    for col in ("preset", "vs reference", "vs release route", "empty rows", "result"):
        t.add_column(col)
    for c in found.checks:
        if "error" in c:
            t.add_row(c["preset"], "", "", "", f"[red]FAILED[/]: {escape(c['error'])}")
            continue
        kernel = "n/a (release route)" if c.get("kernel_error") is None else f"{c['kernel_error']:.2e}"
        release = "" if c.get("release_difference") is None else f"{c['release_difference']:.2e}"
        zeros = "" if c.get("zero_rows_ok") is None else ("0" if c["zero_rows_ok"] else "[red]not 0[/]")
        t.add_row(c["preset"], kernel, release, zeros, "[green]ok[/]" if c.get("ok") else "[red]WRONG[/]")
    print_table(t, out)
    if not found.timings:
        return
    t = Table(title="timing (median of CUDA events; ratio = release route / kernel)", title_justify="left")
    for col in ("preset", "context", "batch", "kernel", "release route", "ratio"):
        t.add_column(col, justify="right")
    for timing in found.timings:
        if timing.get("error"):
            t.add_row(timing["preset"], "", "", "", "", f"[red]{escape(timing['error'])}[/]")
        for cell in timing["cells"]:
            t.add_row(timing["preset"], f"{cell['context'] // 1024}k", str(cell["batch"]), f"{cell['kernel_us']} us",
                      f"{cell['release_us']} us", f"{cell['ratio']}x")
    print_table(t, out)
