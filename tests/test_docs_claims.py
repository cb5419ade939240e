"""What README.md and docs/*.md quote must exist: a reader copies a `vllm-patch` command, a `make` target or a
path from them, so each is checked against the click group, the Makefile and the repository, and the number of
release lines the prose states against the lines there are (lines.lines_of). Offline, in well under a second."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from vllm_patch.cli import main
from vllm_patch.lines import lines_of

PROJECT = Path(__file__).resolve().parents[1]
# docs/cli.md is the click group's own --help, generated (tests/test_cli_reference.py keeps it current): its prose
# ("make one commit per patch") is no quote of a command or a target.
DOCS = [PROJECT / "README.md", *sorted(p for p in (PROJECT / "docs").glob("*.md") if p.name != "cli.md")]
# Top-level folders whose paths the docs quote as the repository's own.
ROOTS = ("tests", "benchmarks", "gpu", "docs", "lines", "patches", "devtools", "tool", "scripts", "guard", ".ci")
NUMBERS = {"both": 2, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
INVOCATION = re.compile(r"(?:^|(?<=[\s/(]))vllm-patch((?:[ \t]+[^\s|;&>#]+)*)")
MAKE = re.compile(r"(?:^|(?<=[\s(]))make((?:[ \t]+[A-Z_]+=\S*)*)[ \t]+([a-z][\w-]*)")
PATH = re.compile(rf"(?<![\w./~$-])((?:{'|'.join(re.escape(r) for r in ROOTS)})/[\w./*<>{{}}:\[\]-]*)")
LINE_COUNT = re.compile(rf"\b({'|'.join(NUMBERS)})\s+(?:release\s+|maintained\s+)?lines\b", re.I)


@dataclass(frozen=True)
class Quote:
    """A piece of code a doc quotes, and where."""

    doc: str
    text: str

    def __str__(self) -> str:
        return f"{self.doc}: {self.text.strip()!r}"


def _quotes(doc: Path) -> list[Quote]:
    """The fenced blocks' lines (shell comments cut) and the inline code spans of `doc`."""
    text, name = doc.read_text(), doc.relative_to(PROJECT).as_posix()
    quotes = []
    for block in FENCE.findall(text):
        quotes += [Quote(name, re.split(r"(?:^|\s)#\s", line, maxsplit=1)[0]) for line in block.splitlines()]
    prose = FENCE.sub("", text)
    quotes += [Quote(name, span) for span in SPAN.findall(prose)]
    return quotes


QUOTES = [q for doc in DOCS for q in _quotes(doc)]


def _options(command: click.Command) -> dict[str, bool]:
    """Each option name of `command` -> whether it takes a value."""
    ctx = click.Context(command)
    found = {name: False for name in command.get_help_option_names(ctx)}
    for param in command.params:
        if isinstance(param, click.Option):
            found |= {name: not param.is_flag for name in [*param.opts, *param.secondary_opts]}
    return found


def _invocations() -> list[tuple[Quote, list[str]]]:
    """`vllm-patch ...` wherever quoted, and a span that starts with a command and an option (`status --full`)."""
    found = [(q, m.group(1).split()) for q in QUOTES for m in INVOCATION.finditer(q.text)]
    for q in QUOTES:
        words = q.text.split()
        if len(words) > 1 and words[0] in main.commands and words[1].lstrip("[").startswith("-"):
            found.append((q, words))
    return found


def check_invocation(words: list[str]) -> str | None:
    """What is wrong with `vllm-patch WORDS` (None: nothing, or not a command line at all)."""
    words = [w.strip("[]") for w in words]
    top, i = _options(main), 0
    while i < len(words) and words[i].startswith("-"):
        name = words[i].split("=", 1)[0]
        if name not in top:
            return f"{name} is not an option of vllm-patch"
        i += 1 + (top[name] and "=" not in words[i])
    if i == len(words) or not re.fullmatch(r"[a-z][a-z-]*", words[i]):
        return None  # `vllm-patch` alone, or a message quoting its version (`vllm-patch X.Y.Z`)
    command = main.commands.get(words[i])
    if command is None:
        return f"no command {words[i]!r}"
    known = _options(command)
    bad = [w.split("=", 1)[0] for w in words[i + 1 :] if w.startswith("-") and w.split("=", 1)[0] not in known]
    return f"{words[i]} has no option {', '.join(bad)}" if bad else None


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (PROJECT / "Makefile").read_text(), re.M))


def _resolves(path: str, base: Path) -> bool:
    """Whether `path` (placeholders such as NAME, <line>, X.Y and globs allowed) names something under `base`;
    a `file::test` must name a test that file defines."""
    path, _, test = path.rstrip(".,:;)").partition("::")
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}|\bNAME\b|\bX\.Y(?:\.Z)?\b|\bvX\.Y\b|\bpNN\b", "*", path).rstrip("/")
    found = sorted(base.glob(pattern)) if any(c in pattern for c in "*?[") else [base / pattern]
    found = [f for f in found if f.exists()]
    if not found or not test:
        return bool(found)
    name = re.sub(r"\[.*$", "", test.split("::")[-1])
    return any(
        re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", f.read_text(), re.M)
        for f in found
        if f.is_file()
    )


def test_the_checks_see_the_quotes():
    """The extraction itself: the docs quote many commands, targets and paths (an empty harvest passes nothing)."""
    assert len(_invocations()) > 40
    assert sum(1 for q in QUOTES if MAKE.search(q.text)) > 20
    assert sum(1 for q in QUOTES for _ in PATH.finditer(q.text)) > 40


@pytest.mark.parametrize(
    ("words", "wrong"),
    [
        (["status", "--python", "X"], None),
        (["--line", "v0.20", "rebase", "v0.20.2"], None),
        (["build-wheel", "[--from", "FILE]", "[--out", "dist]"], None),
        (["X.Y.Z"], None),
        (["stat", "--python", "X"], "no command 'stat'"),
        (["revert", "--to", "X"], "revert has no option --to"),
        (["--lines", "v0.20", "check"], "--lines is not an option of vllm-patch"),
    ],
)
def test_the_invocation_check_itself(words, wrong):
    assert check_invocation(words) == wrong


def test_every_quoted_command_is_a_real_command_with_real_options():
    wrong = [f"{q}: {why}" for q, words in _invocations() if (why := check_invocation(words))]
    assert not wrong, "\n".join(wrong)


def test_every_quoted_make_target_exists():
    targets = make_targets()
    wrong = [
        f"{q}: no target {m.group(2)!r}" for q in QUOTES for m in MAKE.finditer(q.text) if m.group(2) not in targets
    ]
    assert not wrong, "\n".join(wrong)


def test_every_quoted_repository_path_exists():
    wrong = [f"{q}: {m.group(1)}" for q in QUOTES for m in PATH.finditer(q.text) if not _resolves(m.group(1), PROJECT)]
    assert not wrong, "\n".join(wrong)


def test_every_relative_link_leads_somewhere():
    wrong = []
    for doc in DOCS:
        for target in LINK.findall(FENCE.sub("", doc.read_text())):
            if not re.match(r"[a-z]+:", target) and not _resolves(target, doc.parent):
                wrong.append(f"{doc.relative_to(PROJECT)}: ({target})")
    assert not wrong, "\n".join(wrong)


def test_the_number_of_lines_stated_is_the_number_there_is():
    """'both lines' was true when there were two; the count in prose (and in `make help`) follows lines/."""
    there = len(lines_of(PROJECT))
    texts = {d.relative_to(PROJECT).as_posix(): d.read_text() for d in DOCS}
    texts["make help"] = "\n".join(re.findall(r"## (.*)", (PROJECT / "Makefile").read_text()))
    wrong = [
        f"{name}: {m.group(0)!r}, but there are {there} lines"
        for name, text in texts.items()
        for m in LINE_COUNT.finditer(text)
        if NUMBERS[m.group(1).lower()] != there
    ]
    assert not wrong, "\n".join(wrong)


def test_the_readmes_test_run_figures_are_the_ones_maintaining_md_gives():
    """The README sums up the test tiers' times; docs/maintaining.md has the runs: the same figures in both."""
    readme = (PROJECT / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("## Three uses")]
    figures = re.findall(r"\b(\d+(?:-\d+)?) s\b", setup)
    maintaining = (PROJECT / "docs" / "maintaining.md").read_text()
    assert figures and not [f for f in figures if f"{f} s" not in maintaining], figures


def test_the_models_of_the_doctors_default_geometry_are_named_where_users_look():
    """The doctor plans for the users' models by default; the README and usage.md name each of them."""
    from vllm_patch.doctor.geometry import DEFAULT_MODEL

    models = [m.strip() for m in DEFAULT_MODEL.split("/")]
    for doc in (PROJECT / "README.md", PROJECT / "docs" / "usage.md"):
        text = doc.read_text()
        assert all(m in text for m in models), (doc.name, models)
