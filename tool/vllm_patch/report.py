"""How outcomes are shown: a rich table with one line per patch and a verdict, or JSON."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from .engine.analysis import State
from .operations import Outcome
from .series import Series

STYLE = {
    State.APPLIES: "cyan", State.APPLIED: "green", State.PARTIAL: "red",
    State.AMBIGUOUS: "red", State.CONFLICT: "red",
}

DONE_WORDS = {"apply": "applied", "revert": "reverted"}
WOULD_WORDS = {"apply": "would apply", "revert": "would revert"}
# Columns holding names and paths never lose a character: they fold in a narrow terminal.
WHOLE = {"overflow": "fold"}
WIDEST = 400


def print_table(table: Table, console: Console) -> None:
    """Print `table` without cutting patch names or paths: in a terminal, long ones fold onto
    more lines; elsewhere (pipes, CI logs, which rich takes as 80 columns) the table is as wide
    as it needs, up to WIDEST columns."""
    if not console.is_terminal:
        wanted = console.measure(table, options=console.options.update_width(WIDEST)).maximum
        if wanted > console.width:
            console = Console(file=console.file, width=min(wanted, WIDEST), highlight=False)
    console.print(table)


def outcome_dict(outcome: Outcome) -> dict[str, Any]:
    """The outcome as ``--json`` prints it: what the table shows, plus each hunk's lines."""
    patches = []
    by_name = {p.name: p for p in outcome.patches}
    for report in outcome.analysis.reports:
        patch = by_name.get(report.name)
        patches.append({
            "name": report.name,
            "state": report.state.value,
            "sha256": patch.sha256 if patch else None,
            "files": list(patch.paths) if patch else [],
            "problems": report.problems(),
            "hunks": [{"path": h.path, "hunk": h.index, "state": h.state.value,
                       "anchor_at": list(h.anchor_at), "result_at": list(h.result_at)}
                      for h in report.hunks],
        })
    found = outcome.found
    return {
        "action": outcome.action,
        "target": outcome.target,
        "verdict": outcome.verdict,
        "ok": outcome.ok,
        "dry_run": outcome.dry_run,
        "found": {"version": found.version, "commit": found.commit, "source": found.source} if found else None,
        "patches": patches,
        "changed": outcome.changed,
        "recovered": outcome.recovered,
        "record_problems": outcome.integrity,
        "notes": outcome.notes,
        "series_from": outcome.series_from,
    }


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def verdict_line(outcome: Outcome) -> str:
    n = len(outcome.analysis.reports)
    if not outcome.ok:
        return f"[red]FAILED[/]: {outcome.action} on {outcome.target}; nothing was changed" \
            if outcome.action in ("apply", "revert") else f"[red]FAILED[/]: {outcome.action} on {outcome.target}"
    if outcome.action in DONE_WORDS:
        would = "would change" if outcome.dry_run else "changed"
        done = (WOULD_WORDS if outcome.dry_run else DONE_WORDS)[outcome.action]
        files = f"{len(outcome.changed)} files" if outcome.changed else "no file"
        return f"[green]OK[/]: {done} {n} patches on {outcome.target} " \
               f"({would} {files})" if outcome.changed else \
               f"[green]OK[/]: nothing to do, {outcome.verdict} ({n} patches)"
    if outcome.action == "check":
        return f"[green]OK[/]: all {n} patches apply cleanly on {outcome.target}, every anchor unique"
    return f"[green]OK[/]: {outcome.verdict} ({outcome.analysis.applied} of {n} patches applied)"


def _after(outcome: Outcome, state: State) -> State | None:
    """The state a write moved a patch to, for apply and revert."""
    if not outcome.ok or outcome.action not in DONE_WORDS:
        return None
    if outcome.action == "apply" and state is State.APPLIES:
        return State.APPLIED
    if outcome.action == "revert" and state is State.APPLIED:
        return State.APPLIES
    return None


def print_outcome(outcome: Outcome, console: Console) -> None:
    title = f"{outcome.action}{' --dry-run' if outcome.dry_run else ''}: {outcome.target}"
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("patch", **WHOLE)
    table.add_column("state")
    table.add_column("detail", overflow="fold")
    for i, report in enumerate(outcome.analysis.reports, 1):
        detail = "\n".join(report.problems())
        state = f"[{STYLE[report.state]}]{report.state.value}[/]"
        after = _after(outcome, report.state)
        if after:
            state += f" -> {'would be ' if outcome.dry_run else ''}[{STYLE[after]}]{after.value}[/]"
        table.add_row(str(i), report.name, state, detail)
    print_table(table, console)
    if outcome.series_from:
        console.print(outcome.series_from, markup=False)
    if outcome.found:
        f = outcome.found
        console.print(f"vLLM found: {f.version or '?'} commit {f.commit or '?'} ({f.source})")
    if outcome.recovered:
        console.print(f"[yellow]recovered[/]: {outcome.recovered}")
    for note in outcome.notes:
        console.print(f"[yellow]note[/]: {note}")
    for problem in outcome.integrity:
        console.print(f"[red]RECORD[/]: {problem}")
    console.print(verdict_line(outcome))


def print_series(series: Series, console: Console) -> None:
    pin = series.pin
    console.print(f"vLLM {pin.version} (tag {pin.tag}, commit {pin.commit})"
                  + (f", also proven on {', '.join(pin.also)}" if pin.also else ""))
    console.print(f"  sdist {pin.sdist.filename} sha256:{pin.sdist.sha256}")
    console.print(f"  wheel {pin.wheel.filename} sha256:{pin.wheel.sha256}")
    table = Table(title=f"series {series.digest}: {len(series.patches)} patches", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("patch", **WHOLE)
    table.add_column("subject", max_width=48)
    table.add_column("origin", max_width=56, overflow="fold")
    table.add_column("files", **WHOLE)
    for i, p in enumerate(series.patches, 1):
        table.add_row(str(i), p.name, p.subject, p.trailer("Origin") or "", "\n".join(p.paths))
    print_table(table, console)


def series_dict(series: Series) -> dict[str, Any]:
    pin = series.pin
    return {
        "pin": {"version": pin.version, "tag": pin.tag, "commit": pin.commit, "also": list(pin.also),
                "sdist": {"filename": pin.sdist.filename, "sha256": pin.sdist.sha256},
                "wheel": {"filename": pin.wheel.filename, "sha256": pin.wheel.sha256}},
        "digest": series.digest,
        "patches": [{"name": p.name, "subject": p.subject, "author": p.author, "date": p.date,
                     "sha256": p.sha256, "trailers": dict(p.trailers), "files": list(p.paths)}
                    for p in series.patches],
    }


def print_rebase(result, console: Console, as_json: bool, show_range_diff: bool, error: str | None = None) -> None:
    """The rebase report: one line per patch, then the range-diffs of merged patches."""
    if as_json:
        print_json({
            "tag": result.tag, "done": result.done, "error": error,
            "pin": {"version": result.pin.version, "commit": result.pin.commit} if result.pin else None,
            "work_dir": str(result.work_dir) if result.work_dir else None,
            "patches": [{"name": o.name, "step": o.step.value, "files": o.files, "conflicts": o.conflicts,
                         "note": o.note, "range_diff": o.range_diff, "moved": getattr(o, "moved", {}),
                         "gone": getattr(o, "gone", []), "regions": getattr(o, "regions", 0),
                         "problems": getattr(o, "problems", [])} for o in result.outcomes],
            "notes": getattr(result, "notes", []),
        })
        return
    styles = {"clean": "green", "upstreamed": "cyan", "merged": "yellow", "conflict": "red", "obsolete": "magenta",
              "dropped": "magenta"}
    table = Table(title=f"rebase onto {result.tag}", title_justify="left")
    for col in ("#", "patch", "result", "detail"):
        table.add_column(col)
    for i, o in enumerate(result.outcomes, 1):
        detail = ", ".join(o.conflicts) if o.conflicts else o.note
        if o.step.value == "merged":
            detail = (detail + "; " if detail else "") + "review it"
        if o.step.value == "upstreamed":
            detail = "dropped, logged in dropped-patches"
        if o.step.value in ("obsolete", "dropped"):
            detail = f"dropped ({o.note}), logged in dropped-patches"
        if getattr(o, "problems", None):
            detail = "; ".join(o.problems[:5])
        if getattr(o, "gone", None):
            detail = "deleted upstream: " + ", ".join(o.gone) + (f"; {detail}" if detail else "")
        table.add_row(str(i), o.name, f"[{styles[o.step.value]}]{o.step.value}[/]", detail)
    console.print(table)
    for o in result.outcomes:
        if o.range_diff and (show_range_diff or o.step.value == "merged"):
            console.print(f"[bold]range-diff {o.name}[/]")
            console.print(o.range_diff, markup=False, highlight=False)
    for note in getattr(result, "notes", []):
        console.print(f"note: {note}", markup=False)
    if result.done and result.pin:
        console.print(f"[green]OK[/]: rebased onto {result.pin.tag} ({result.pin.version}, commit "
                      f"{result.pin.commit[:12]}); series and patches rewritten")
