"""The ``vllm-patch`` command line."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from . import __version__, operations, report
from .doctor import PRESETS, render
from .errors import EXIT_OK, EXIT_PATCH_FAILED, EXIT_USAGE, VllmPatchError
from .lines import CURRENT, line_named
from .locate import SeriesHome, find_home
from .operations import PatchFailedWith
from .series import Series, load_series
from .targets import KINDS, open_target
from .targets.base import Target

DEBUG_ENV = "VLLM_PATCH_DEBUG"

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _home(ctx: click.Context) -> SeriesHome:
    """Where the series lives (locate.find_home: --series, $VLLM_PATCH_SERIES, the current
    directory and its parents, the tool's checkout, the lines bundled with the tool)."""
    return find_home(ctx.obj.get("series_dir"))


def _root(ctx: click.Context) -> Path:
    """The series directory (the project holding every line)."""
    return _home(ctx).root


def _line_root(ctx: click.Context) -> Path:
    """The directory of --line NAME's series, else the top-level one (the current release's)."""
    home = _home(ctx)
    name = ctx.obj.get("line")
    with home.reading():
        return line_named(home.root, name).root if name else home.root


def _editable_root(ctx: click.Context) -> Path:
    """The line's directory for a command that edits the series: never the copy bundled with the tool."""
    _home(ctx).check_writable()
    return _line_root(ctx)


def _series(ctx: click.Context) -> Series:
    """The series of --line NAME, else the top-level one (the current release's)."""
    with _home(ctx).reading():
        return load_series(_line_root(ctx))


def _series_for(ctx: click.Context, target: Target, force: bool) -> tuple[Series, str | None, str]:
    """The series for `target` (--line NAME, else the line proven on the target's vLLM), the note
    naming its line, and where it came from."""
    home = _home(ctx)
    series, note, root = operations.series_for(home, target, ctx.obj.get("line"), force)
    return series, note, home.describe(root, series)


def handle_errors(fn):
    """Turn every known error into its one-line message and exit code, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except PatchFailedWith as exc:
            if as_json:
                report.print_json(report.outcome_dict(exc.outcome) | {"error": exc.message})
            else:
                report.print_outcome(exc.outcome, out)
                err.print(f"error: {exc.message}", markup=False)
            sys.exit(exc.exit_code)
        except VllmPatchError as exc:
            if as_json:
                report.print_json({"error": exc.message, "exit_code": exc.exit_code})
            err.print(f"error: {exc.message}", markup=False)
            sys.exit(exc.exit_code)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            err.print(f"error: {exc.strerror or exc}{where}", markup=False)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            err.print("interrupted: any partial write was rolled back", markup=False)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - the last resort: one line, never a traceback
            message = " ".join(f"unexpected {type(exc).__name__}: {exc}".split())
            if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                traceback.print_exc()
            else:
                message += f" (a bug in vllm-patch; {DEBUG_ENV}=1 shows the traceback)"
            if as_json:
                report.print_json({"error": message, "exit_code": EXIT_USAGE})
            err.print(f"error: {message}", markup=False)
            sys.exit(EXIT_USAGE)
    return wrapper


def target_options(fn):
    """Options shared by the commands that act on a target."""
    options = [
        click.option("--target", "target_spec", metavar="PATH|site-packages",
                     help="A vLLM git checkout, a site-packages dir or unpacked wheel, a source tree, "
                          "or 'site-packages' for this interpreter's installed vLLM."),
        click.option("--python", "python", metavar="EXE",
                     help="Act on the vLLM installed for another interpreter (e.g. a venv's python)."),
        click.option("--kind", type=click.Choice(KINDS), default="auto", show_default=True,
                     help="Treat the target as this kind instead of guessing it."),
        click.option("--wait", type=float, default=30.0, show_default=True,
                     help="Seconds to wait for another run's lock on the target."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _open(target_spec: str | None, python: str | None, kind: str) -> Target:
    if not target_spec and not python:
        raise click.UsageError("give --target PATH (or 'site-packages') or --python EXE")
    if target_spec and python:
        raise click.UsageError("give --target or --python, not both (--python EXE means EXE's site-packages)")
    if python and kind not in ("auto", "site-packages"):
        raise click.UsageError(f"--python EXE acts on an installed vLLM: --kind {kind} does not go with it")
    return open_target(target_spec or "", kind, python)


def _emit(outcome: operations.Outcome, as_json: bool) -> None:
    if as_json:
        report.print_json(report.outcome_dict(outcome))
    else:
        report.print_outcome(outcome, out)


def _noted(outcome: operations.Outcome, note: str | None) -> operations.Outcome:
    if note:
        outcome.notes.insert(0, note)
    return outcome


def _waiting() -> None:
    err.print("waiting for another vllm-patch run on this target to finish...")


def _after_command(key: str):
    def callback(ctx: click.Context, param: click.Parameter, value) -> None:
        if value:
            ctx.ensure_object(dict)[key] = value
    return callback


class SeriesGroup(click.Group):
    """The command group; every subcommand also takes ``--series DIR`` and ``--line NAME``
    after its name."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any(getattr(p, "name", None) == "series_after" for p in cmd.params):
            cmd.params.append(click.Option(
                ["--series", "series_after"], type=click.Path(file_okay=False, path_type=Path),
                expose_value=False, is_eager=True, callback=_after_command("series_dir"),
                help="Directory holding 'series' and 'patches/' (as before the command)."))
            cmd.params.append(click.Option(
                ["--line", "line_after"], metavar="NAME", expose_value=False, is_eager=True,
                callback=_after_command("line"), help="The release line (as before the command)."))
        super().add_command(cmd, name)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's own errors (unknown command or option, bad value) as one line and exit 2, like
        every other error, instead of click's usage, hint and message."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # no command at all: the help it asks for
            exc.show()
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            err.print(f"error: {usage_message(exc)}", markup=False)
            sys.exit(EXIT_USAGE)
        except click.Abort:
            err.print("aborted", markup=False)
            sys.exit(130)
        sys.exit(EXIT_OK)  # --help and --version end here too (click returns their exit code, 0)


def usage_message(exc: click.ClickException) -> str:
    """click's message on one line, with where to look for help."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see '{ctx.command_path} --help')" if ctx is not None else message


@click.group(cls=SeriesGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--series", "series_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Directory holding 'series' and 'patches/' (default: $VLLM_PATCH_SERIES, else found from "
              "the working directory up, else the lines bundled with vllm-patch).")
@click.option("--line", metavar="NAME", envvar="VLLM_PATCH_LINE",
              help="The release line: 'current' (the top-level series) or a folder of lines/ (e.g. v0.20). "
              "Default: for a target, the line pinned to its vLLM; otherwise 'current'.")
@click.version_option(__version__, prog_name="vllm-patch")
@click.pass_context
def main(ctx: click.Context, series_dir: Path | None, line: str | None) -> None:
    """Check, apply, revert and package a pinned series of fixes for vLLM.

    Exit codes: 0 as asked; 1 a patch does not check, apply or revert (nothing
    was changed); 2 a usage or environment error (nothing was changed).
    """
    ctx.ensure_object(dict)
    ctx.obj["series_dir"] = series_dir
    ctx.obj["line"] = line or None


@main.command("series")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
@handle_errors
def series_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show where the series comes from, the pin and the patches with their headers."""
    root = _line_root(ctx)
    series = _series(ctx)
    source = _home(ctx).describe(root, series)
    if as_json:
        report.print_json(report.series_dict(series) | {"from": source})
    else:
        out.print(source, markup=False)
        report.print_series(series, out)


@main.command("export")
@click.argument("dest", type=click.Path(path_type=Path))
@click.pass_context
@handle_errors
def export_cmd(ctx: click.Context, dest: Path) -> None:
    """Write the line out as a plain series in DEST (a new or empty folder): its series file and every patch under
    patches/, those it carries from another line included, for quilt or git am."""
    names = operations.export(_series(ctx), dest, ctx.obj.get("line") or CURRENT)
    out.print(f"OK: wrote {len(names)} patches and the series to {dest}", markup=False)


@main.command()
@click.option("--base", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A pristine vLLM checkout or source tree (default: the pinned PyPI sdist, cached).")
@click.option("--force", is_flag=True, help="Check even if the base is not the pinned release.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
@handle_errors
def check(ctx: click.Context, base: Path | None, force: bool, as_json: bool) -> None:
    """Check that every anchor is unique and the series applies cleanly on the pinned base."""
    outcome = operations.check_base(_series(ctx), base, force, quiet=as_json)
    _emit(outcome, as_json)
    sys.exit(EXIT_OK if outcome.ok else EXIT_PATCH_FAILED)


def write_command(action: str, verb: str, commit_help: str):
    """`apply` and `revert`: the same options, the same flow."""
    run_op = {"apply": operations.apply, "revert": operations.revert}[action]

    @target_options
    @click.option("--dry-run", is_flag=True, help="Compute and report, write nothing.")
    @click.option("--force", is_flag=True, help=f"{verb} even if the target is not the pinned vLLM release.")
    @click.option("--commit", "commit_each", is_flag=True, help=commit_help)
    @click.pass_context
    @handle_errors
    def command(ctx, target_spec, python, kind, wait, as_json, dry_run, force, commit_each) -> None:
        target = _open(target_spec, python, kind)
        series, line_note, source = _series_for(ctx, target, force)
        outcome = run_op(target, series, dry_run, force, commit_each, wait, _waiting)
        outcome.series_from = source
        _emit(_noted(outcome, line_note), as_json)
    return command


main.command("apply", help="Apply the series to a target, all or nothing (idempotent).")(
    write_command("apply", "Apply", "Checkout: make one commit per patch."))
main.command("revert", help="Revert every applied patch, restoring the original bytes.")(
    write_command("revert", "Revert", "Checkout: make one revert commit per patch."))


@main.command()
@target_options
@click.option("--full", is_flag=True, help="Verify every RECORD entry, not only the touched files.")
@click.option("--expect", type=click.Choice(["applied", "applies"]),
              help="Exit 1 unless every patch is in this state (e.g. in an image build).")
@click.pass_context
@handle_errors
def status(ctx, target_spec, python, kind, wait, as_json, full, expect) -> None:
    """Show each patch's state on a target, the vLLM version/commit against the pin,
    and RECORD integrity."""
    target = _open(target_spec, python, kind)
    series, line_note, source = _series_for(ctx, target, False)
    outcome = operations.status(target, series, full, wait, force=True, on_wait=_waiting, expect=expect)
    outcome.series_from = source
    _emit(_noted(outcome, line_note), as_json)
    sys.exit(EXIT_OK if outcome.ok else EXIT_PATCH_FAILED)


@main.command("build-wheel")
@click.option("--from", "source", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The upstream wheel to patch (default: the pinned wheel, downloaded and cached).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("dist"),
              show_default=True, help="Where to write the patched wheel.")
@click.option("--wait", type=float, default=30.0, show_default=True,
              help="Seconds to wait for another run writing into --out.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_context
@handle_errors
def build_wheel_cmd(ctx: click.Context, source: Path | None, out_dir: Path, wait: float, as_json: bool) -> None:
    """Build a patched vLLM wheel (version <release>+vp.<series digest>) from the line's pinned upstream wheel,
    or from the wheel given with --from (with the line proven on its release)."""
    series, line_note, _ = operations.series_for_wheel(_home(ctx), source, ctx.obj.get("line"))
    built = operations.build_wheel(series, source, out_dir, quiet=as_json, wait=wait, on_wait=_waiting)
    notes = ([line_note] if line_note else []) + built.notes
    if as_json:
        report.print_json({"wheel": str(built.path), "version": built.version, "changed": built.changed,
                           "patches": list(series.names), "notes": notes})
        return
    for note in notes:
        out.print(f"[yellow]note[/]: {note}")
    out.print(f"patched {len(built.changed)} files with {len(series.patches)} patches")
    out.print(f"[green]OK[/]: wrote {built.path} (vllm {built.version})")


@main.command()
@click.argument("tag", required=False)
@click.option("--continue", "resume", is_flag=True, help="Go on after resolving a conflict by hand (the resolution is "
              "checked, then the stopped patch is regenerated from it).")
@click.option("--skip", is_flag=True, help="Drop the stopped patch (logged in dropped-patches) and go on.")
@click.option("--drop", "drops", multiple=True, metavar="NAME", help="Drop patch NAME, logged with --reason: with "
              "TAG, before the rebase runs (repeatable); alone, the stopped patch.")
@click.option("--reason", help="Why the patches given with --drop or --skip are dropped (kept in dropped-patches).")
@click.option("--allow-new-file", "allow_new", multiple=True, metavar="PATH",
              help="With --continue: accept a resolution that creates PATH although the new base has no such file.")
@click.option("--abort", is_flag=True, help="Forget a stopped rebase; the series stays as it was.")
@click.option("--repo", metavar="PATH|URL", help="Take both trees from this git checkout or URL (default: the "
              "PyPI sdists of the releases).")
@click.option("--range-diff", "show_range_diff", is_flag=True, help="Show how every kept patch changed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
@handle_errors
def rebase(ctx: click.Context, tag: str | None, resume: bool, skip: bool, drops: tuple[str, ...], reason: str | None,
           allow_new: tuple[str, ...], abort: bool, repo: str | None, show_range_diff: bool, as_json: bool) -> None:
    """Rebase the series onto TAG (e.g. v0.21.0): clean, merged, upstreamed or obsolete (dropped), or conflict."""
    root = _editable_root(ctx)
    try:
        result = operations.rebase(root, tag, resume, skip, drops, reason, allow_new, abort, repo, quiet=as_json,
                                   on_recovered=lambda what: err.print(f"recovered: {what}"))
        if abort:
            out.print("rebase aborted; the series is as it was" if result else "no rebase in progress")
            return
    except operations.RebaseConflict as exc:
        report.print_rebase(exc.result, out, as_json, show_range_diff, error=exc.message)
        err.print(f"error: {exc.message}", markup=False)
        sys.exit(exc.exit_code)
    report.print_rebase(result, out, as_json, show_range_diff)


@main.command()
@click.option("--releases", metavar="A,B,...", help="Only these releases (e.g. 0.21.0,v0.33.0).")
@click.option("--to", "to_tag", metavar="TAG", help="The pinned release and every newer one up to TAG.")
@click.option("--repo", metavar="PATH|URL", help="Take the trees from this git checkout or URL (tags vX.Y.Z) "
              "instead of the PyPI sdists.")
@click.option("--markdown", "markdown", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write the report as Markdown to FILE ('-': print it instead of the table).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
@handle_errors
def outlook(ctx: click.Context, releases: str | None, to_tag: str | None, repo: str | None, markdown: Path | None,
            as_json: bool) -> None:
    """Each patch's fate on the pinned release and every newer one: stacked and alone.

    Nothing in the series changes. Exit 0 whatever the fates are; 2 on bad input.
    """
    if releases and to_tag:
        raise click.UsageError("give --releases or --to, not both")
    root = _root(ctx)
    series = _series(ctx)
    quiet = as_json or str(markdown) == "-"
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err,
                  transient=True, disable=quiet) as progress:
        task = progress.add_task("outlook", total=None)

        def step(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=what)

        result = operations.outlook(series, [r for r in (releases or "").split(",") if r.strip()] or None,
                                    to_tag, repo, quiet, step, root)
    text = report.outlook_markdown(result) if markdown else None
    if markdown and str(markdown) != "-":
        report.write_report(markdown, text or "")
    if as_json:
        report.print_json(report.outlook_dict(result))
    elif str(markdown) == "-":
        print(text, end="")
    else:
        report.print_outlook(result, out)
        if markdown:
            out.print(f"wrote {markdown}")


def _assumed_limits(value: str | None) -> dict | None:
    if not value:
        return None
    cap, sep, size = value.partition(":")
    try:
        major, _, minor = cap.partition(".")
        capability = 10 * int(major) + int(minor or 0)
        max_shared = int(size)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give CC:BYTES, e.g. 8.6:101376", param_hint="--assume-limits") from None
    if not sep or max_shared <= 0:
        raise click.BadParameter(f"{value!r}: give CC:BYTES, e.g. 8.6:101376", param_hint="--assume-limits")
    return {"capability": capability, "max_shared": max_shared, "hip": False}


@main.command()
@click.option("--python", metavar="EXE", help="The interpreter whose vLLM, torch and GPUs to examine "
              "(default: the one running vllm-patch).")
@click.option("--target", "target_spec", metavar="PATH", help="The vLLM to examine: a site-packages dir or a source "
              "tree, instead of --python's (the GPU part still runs in --python's interpreter).")
@click.option("--device", type=int, metavar="N", help="Only GPU N (default: every visible GPU; the kernel check runs "
              "on the first).")
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A model directory: the attention geometry from its config.json (default: Qwen3.6-27B / "
              "Qwen3.8-27B, 24 query / 4 KV heads of 256).")
@click.option("--tp", "tps", type=click.IntRange(1), multiple=True, metavar="N",
              help="Tensor-parallel sizes to plan for, one geometry per rank (default: 1 and 2).")
@click.option("--preset", "presets", type=click.Choice(PRESETS), multiple=True,
              help="Only these TurboQuant presets (default: all four).")
@click.option("--assume-limits", metavar="CC:BYTES", help="Plan the route for another GPU instead, from its compute "
              "capability and shared memory per block (e.g. 8.6:101376, an RTX 3090); no GPU needed, no check.")
@click.option("--interpret", is_flag=True, help="Without a GPU: check the kernel on the CPU under TRITON_INTERPRET=1 "
              "(slow: give a small --model).")
@click.option("--no-timing", is_flag=True, help="Check the kernel, do not time it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON to attach to an issue (no path of this machine "
              "beyond those given).")
@click.pass_context
@handle_errors
def doctor(ctx: click.Context, python: str | None, target_spec: str | None, device: int | None,
           model_dir: Path | None, tps: tuple[int, ...], presets: tuple[str, ...], assume_limits: str | None,
           interpret: bool, no_timing: bool, as_json: bool) -> None:
    """Show the installed vLLM, its line and each patch's state, the guard and the environment; the GPUs, the
    route the line's multi-query kernel takes there; and that kernel checked against a float64 reference and
    the release's route, with a speed ratio.

    Exit codes: 0 all is well (also with no GPU); 1 the line is not fully applied, or the kernel gave a wrong
    result; 2 an environment error.
    """
    home = _home(ctx)
    options = dict(model_dir=model_dir, device=device, interpret=interpret, assumed=_assumed_limits(assume_limits),
                   presets=presets or PRESETS, timing=not no_timing, line=ctx.obj.get("line"))
    if tps:
        options["tps"] = tuple(dict.fromkeys(tps))
    live = not as_json and err.is_terminal
    with err.status("vllm-patch doctor", spinner="dots") if live else contextlib.nullcontext() as status:
        def progress(text: str) -> None:
            if status is not None:
                status.update(f"vllm-patch doctor: {text}")

        found = operations.doctor(home, python, target_spec, progress, **options)
    if as_json:
        data = render.to_dict(found)
        report.print_json(render.scrubber(found, home.root)(data))
    else:
        render.print_text(found, out)
    sys.exit(found.exit_code)


def _author(ctx: click.Context, upstream: str | None, quiet: bool):
    return operations.author(_editable_root(ctx), upstream, quiet)


def _authored(result, as_json: bool) -> None:
    if as_json:
        report.print_json({"patch": result.name, "changed": result.changed, "notes": result.notes})
        return
    for note in result.notes:
        out.print(f"[yellow]note[/]: {note}")
    verb = "wrote" if result.changed else "unchanged:"
    out.print(f"[green]OK[/]: {verb} {result.name}")


upstream_option = click.option("--upstream", metavar="PATH|URL",
                               help="Take the pinned base from this git checkout or URL (default: the PyPI sdist).")
unique_option = click.option("--unique", is_flag=True,
                             help="Widen the context of ambiguous hunks until every anchor is unique.")


header_options = [
    click.option("--subject", help="The patch's one-line summary."),
    click.option("--author", help="'Name <email>' (default: the diff's, or vllm-patch)."),
    click.option("--origin", help="Origin: the upstream PR or commit URL, or 'vendor'."),
    click.option("--bug", help="Bug: the upstream issue URL."),
    click.option("--forwarded", help="Forwarded: where it was sent upstream (default 'no')."),
]


def authoring_command(header: bool):
    """The options and error handling that refresh, new and import share."""
    options = [*(header_options if header else []), unique_option, upstream_option,
               click.option("--json", "as_json", is_flag=True, help="Print JSON."), click.pass_context, handle_errors]

    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


@main.command()
@click.argument("name")
@click.option("--from", "tree", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The edited tree: the pinned base with the patches up to NAME, plus your edits.")
@click.option("--file", "files", multiple=True, metavar="PATH", help="Also record this file's changes.")
@authoring_command(header=False)
def refresh(ctx, name, tree, files, unique, upstream, as_json) -> None:
    """Regenerate patch NAME from an edited tree, keeping its header (no edit: no byte changes)."""
    _authored(_author(ctx, upstream, as_json).refresh(name, tree, unique, list(files)), as_json)


@main.command()
@click.argument("name", required=False)
@click.option("--from", "tree", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A tree holding the pinned base with the whole series applied, plus the new edits.")
@click.option("--file", "files", multiple=True, required=True, metavar="PATH", help="A file the patch changes.")
@authoring_command(header=True)
def new(ctx, name, tree, files, subject, author, origin, bug, forwarded, unique, upstream, as_json) -> None:
    """Start a patch at the end of the series from edited files, with a DEP-3 header.

    NAME is the patch file name (default: NNNN-subject.patch); .patch is added when it lacks it.
    """
    if not subject:
        raise click.UsageError("give --subject")
    header = operations.header(name, subject, author or "vllm-patch <vllm-patch@localhost>", origin, bug, forwarded)
    _authored(_author(ctx, upstream, as_json).new(name, tree, list(files), header, unique), as_json)


@main.command()
@click.option("--check", "check_only", is_flag=True,
              help="Only say which files differ from the newer line's text (exit status 1 if any); write nothing.")
@upstream_option
@click.pass_context
@handle_errors
def carry(ctx: click.Context, check_only: bool, upstream: str | None) -> None:
    """Give every file the line adds whole the text a newer line's patch of the same name adds (the multi-query
    kernel, say), rewriting the line's patches that differ; their other changes and headers stay."""
    root = _editable_root(ctx)
    if check_only:
        files = operations.carried_files(root)
    else:
        files, written = operations.carry(root, upstream)
        for result in written:
            _authored(result, False)
    report.print_carried(files, out)
    if check_only and not all(f.same for f in files):
        sys.exit(EXIT_PATCH_FAILED)


@main.command("import")
@click.argument("source")
@click.option("--repo", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="SOURCE is a commit range (A..B) of this git checkout: one patch per commit.")
@click.option("--name", help="The patch file name (default: NNNN-subject.patch; .patch is added when missing).")
@authoring_command(header=True)
def import_cmd(ctx, source, repo, name, subject, author, origin, bug, forwarded, unique, upstream, as_json) -> None:
    """Add a patch from a .diff/.patch file (e.g. a PR's diff) or a git commit range."""
    def header_for(single: bool):
        return operations.header(name if single else None, subject if single else None, author, origin, bug, forwarded)

    root = _editable_root(ctx)
    for result in operations.import_patches(root, source, repo, header_for, unique, upstream, as_json):
        _authored(result, as_json)


def run() -> None:
    """The group with its program name: it prints every error as one line and exits with its code. The
    console script and ``python -m`` enter through `vllm_patch.entry.run`, which calls `main` itself."""
    main(prog_name="vllm-patch")
