"""docs/cli.md is what devtools/cli_reference.py makes of every command's --help: regenerated in memory and
compared, so an option or docstring changed without the reference fails here. Offline, well under a second."""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "devtools"))

import cli_reference  # noqa: E402

from vllm_patch.cli import main  # noqa: E402


def test_docs_cli_md_is_current():
    assert cli_reference.DOC.read_text() == cli_reference.reference(), (
        "docs/cli.md is stale: run python devtools/cli_reference.py")


def test_every_command_has_its_section_and_its_options():
    text = cli_reference.reference()
    for name, command in main.commands.items():
        assert f"## vllm-patch {name}\n" in text, name
        section = text.split(f"## vllm-patch {name}\n", 1)[1].split("\n## ", 1)[0]
        options = [o for p in command.params if isinstance(p, click.Option) for o in p.opts if o.startswith("--")]
        assert all(o in section for o in options), (name, [o for o in options if o not in section])


def test_the_reference_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    assert cli_reference.reference() == cli_reference.DOC.read_text()


def test_check_mode_reports_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "cli.md"
    stale.write_text(cli_reference.DOC.read_text().replace("--dry-run", "--dryrun", 1))
    monkeypatch.setattr(cli_reference, "DOC", stale)
    monkeypatch.setattr(cli_reference, "PROJECT", tmp_path)
    assert cli_reference.main(["--check"]) == 1
    assert "run python devtools/cli_reference.py" in capsys.readouterr().err
    assert cli_reference.main([]) == 0 and cli_reference.main(["--check"]) == 0
