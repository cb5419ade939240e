"""How every command's result is shown: rich tables, text, Markdown and JSON, in one place.

The rooms compute (operations returns an Outcome, a RebaseResult, an Outlook); this module only
renders them, so the CLI stays a parser and the wording of each output is found in one file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from .engine.analysis import State
from .operations import Outcome
from .series import Series

if TYPE_CHECKING:  # the outlook's types only: importing lifecycle at run time would bring GitPython to start-up
    from .lifecycle.outlook import Cell, Outlook, Row
    from .lifecycle.upstream_trees import Moves

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


# ----------------------------------------------------------------------------- outlook

GLYPHS = {"clean": "✓", "merged": "≈", "moved": "→", "upstreamed": "↑", "obsolete": "⊘", "conflict": "✗",
          "gone": "†"}
MEANING = {
    "clean": "applies as is",
    "merged": "3-way merge, checked (review it)",
    "moved": "its files moved upstream; goes through at the new paths",
    "upstreamed": "the release has its result",
    "obsolete": "its Obsolete-If checks hold",
    "conflict": "needs a hand merge",
    "gone": "a file it changes was deleted upstream",
}
PARTLY = "◐"
FATE_STYLES = {"clean": "green", "merged": "yellow", "moved": "blue", "upstreamed": "cyan", "obsolete": "magenta",
               "conflict": "red", "gone": "bold red"}


def glyph(cell: Cell) -> str:
    """A cell's fate as one glyph, marked ◐ where some of the patch's Obsolete-If parts hold."""
    return GLYPHS[cell.state] + (PARTLY if cell.partly else "")


def cell_detail(cell: Cell, moves: Moves) -> str:
    """What the glyph cannot say: moved and deleted files, conflict regions, failed checks, reasons."""
    parts = []
    if cell.moved:
        parts.append("moved " + ", ".join(moves.describe(a) for a in cell.moved))
    if cell.gone:
        parts.append("deleted upstream: " + ", ".join(cell.gone))
    conflicts = {p: n for p, n in cell.conflicts.items() if p not in cell.gone}
    if conflicts:
        total = sum(conflicts.values())
        parts.append(f"conflict in {len(conflicts)} file{'s' if len(conflicts) != 1 else ''}, {total} "
                     f"region{'s' if total != 1 else ''}: " + ", ".join(f"{p} ({n})" for p, n in conflicts.items()))
    if cell.problems:
        parts.append("merged, but does not check: " + "; ".join(cell.problems[:3])
                     + (f" (+{len(cell.problems) - 3})" if len(cell.problems) > 3 else ""))
    if cell.state == "moved":
        parts.append(f"{cell.via} there")
    if cell.state == "obsolete":
        parts.append(cell.reason)
    if cell.state == "upstreamed":
        parts.append("the release has its result")
    if cell.state == "merged":
        parts.append("3-way merge, checked")
    if cell.partly:
        parts.append(cell.partly)
    return "; ".join(parts)


def cell_dict(cell: Cell) -> dict[str, Any]:
    """A cell as ``--json`` prints it: the state, and only the fields that say something."""
    out: dict[str, Any] = {"state": cell.state}
    for key in ("via", "moved", "gone", "conflicts", "problems", "reason", "partly"):
        if getattr(cell, key):
            out[key] = getattr(cell, key)
    if cell.conflicts:
        out["regions"] = sum(cell.conflicts.values())
    return out


def short(name: str) -> str:
    """A patch's column label: its number (``0004``), else its name."""
    head = name.split("-", 1)[0]
    return head if head.isdigit() else name.removesuffix(".patch")


def cell_text(row: Row, name: str) -> tuple[str, str]:
    """The table cell (stacked glyph, then the alone glyph where it differs) and its style."""
    s, a = glyph(row.stacked[name]), glyph(row.alone[name])
    text = s if s == a else f"{s}/{a}"
    return text, FATE_STYLES[row.stacked[name].state]


def legend() -> str:
    return "  ".join(f"{GLYPHS[k]} {k}" for k in GLYPHS) + f"  {PARTLY} partly obsolete (carried)" \
        "  (x/y: stacked/alone where they differ)"


def _ranges(versions: list[str], order: list[str]) -> str:
    """'0.22.0..0.27.1, 0.33.0': runs of consecutive releases (in the outlook's order)."""
    pos = {v: i for i, v in enumerate(order)}
    runs: list[list[str]] = []
    for v in sorted(versions, key=lambda x: pos[x]):
        if runs and pos[runs[-1][-1]] + 1 == pos[v]:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs)


def details(result: Outlook) -> list[tuple[str, str, str]]:
    """(patch label, releases, text) for every cell that is not plain clean, identical texts grouped."""
    groups: dict[tuple[str, str], list[str]] = {}
    for row in result.rows:
        for name in result.names:
            ts, ta = cell_detail(row.stacked[name], row.moves), cell_detail(row.alone[name], row.moves)
            if ts == ta:
                if ts:
                    groups.setdefault((name, ts), []).append(row.version)
                continue
            if ts:
                groups.setdefault((name, f"stacked: {ts}"), []).append(row.version)
            groups.setdefault((name, f"alone: {ta or 'clean'}"), []).append(row.version)
    order = [r.version for r in result.rows]
    names = {n: i for i, n in enumerate(result.names)}
    items = sorted(groups.items(), key=lambda kv: (names[kv[0][0]], order.index(kv[1][0])))
    return [(short(name), _ranges(vs, order), text) for (name, text), vs in items]


def print_outlook(result: Outlook, console: Console) -> None:
    """The outlook as a table of glyphs, a release a row, then the legend and each cell's details."""
    pin = result.pin
    table = Table(title=f"outlook of series {result.digest} (pinned to vLLM {pin.version}): "
                        f"{len(result.rows)} releases", title_justify="left")
    table.add_column("release")
    for name in result.names:
        table.add_column(short(name), justify="center")
    table.add_column("moved / gone")
    for row in result.rows:
        cells = [f"[{style}]{text}[/]" for text, style in (cell_text(row, n) for n in result.names)]
        table.add_row(row.version, *cells, f"{len(row.moves.moved)} / {len(row.moves.gone)}")
    console.print(table)
    console.print(legend(), markup=False)
    for name in result.names:
        console.print(f"  {short(name)}: {name}", markup=False)
    for label, versions, text in details(result):
        console.print(f"[bold]{label}[/] {versions}: ", end="")
        console.print(text, markup=False)
    for note in result.notes:
        console.print(f"[yellow]note[/]: {note}")
    console.print(f"{len(result.rows)} releases in {result.seconds:.1f} s; nothing in the series changed")


def outlook_markdown(result: Outlook) -> str:
    """The outlook as Markdown, for an issue or a pull request (``outlook --markdown``)."""
    pin = result.pin
    lines = [f"### vllm-patch outlook: series {result.digest}, pinned to vLLM {pin.version}", "",
             "| release | " + " | ".join(short(n) for n in result.names) + " |",
             "|---|" + "---|" * len(result.names)]
    for row in result.rows:
        lines.append(f"| {row.version} | " + " | ".join(cell_text(row, n)[0] for n in result.names) + " |")
    lines += ["", legend(), ""]
    lines += [f"- `{short(n)}` {n}" for n in result.names]
    found = details(result)
    if found:
        lines += ["", "Details:", ""]
        lines += [f"- **{label}** {versions}: {text}" for label, versions, text in found]
    for note in result.notes:
        lines.append(f"\nNote: {note}")
    return "\n".join(lines) + "\n"


def outlook_dict(result: Outlook) -> dict[str, Any]:
    """The outlook as ``outlook --json`` prints it: every cell of every release, with the legend."""
    pin = result.pin
    return {
        "pin": {"version": pin.version, "tag": pin.tag, "commit": pin.commit},
        "series": result.digest,
        "patches": result.names,
        "legend": {**{k: {"glyph": GLYPHS[k], "meaning": MEANING[k]} for k in GLYPHS},
                   "partly": {"glyph": PARTLY, "meaning": "some of its Obsolete-If parts hold; carried as usual"}},
        "releases": [{
            "version": row.version, "commit": row.tree.commit, "upstream_commit": row.tree.upstream_commit,
            "source": row.tree.source, "moves": row.moves.as_dict(), "seconds": round(row.seconds, 3),
            "patches": {n: {"stacked": cell_dict(row.stacked[n]), "alone": cell_dict(row.alone[n])}
                        for n in result.names},
        } for row in result.rows],
        "notes": result.notes,
        "seconds": round(result.seconds, 3),
    }


def write_report(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed into place (never a half-written report)."""
    path = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise


def print_carried(files, console) -> None:
    """`carry`: each file a patch adds whole as a newer line's patch does, and whether its text is that line's."""
    if not files:
        console.print("no file of this line is added whole by a newer line's patch of the same name", markup=False)
    for f in files:
        state = "same" if f.same else "differs"
        console.print(f"{f.patch}: {f.path}: {state} as {f.source}", markup=False)
