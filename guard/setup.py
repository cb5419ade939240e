"""The guard's build: the metadata is in pyproject.toml; this file generates ``lines.json``.

The guard must know which vLLM releases have a release line and each line's current series, and
the repository's ``series`` and ``lines/*/series`` (with their ``patches/``) are the one source of
truth: built inside the repository (``pip install ./guard``, ``pip wheel ./guard``), the data is
generated from them into the build (never into git); an sdist carries the generated file, so a
wheel built from it (no repository around) uses that. Neither present: the build fails.

The series format is read here as ``vllm_patch.series`` reads it (``#: KEY = VALUE`` pin lines,
``#`` comments, one patch name a line, ``NAME from LINE[/NAME]`` for a patch read from another line's
``patches/``), and the digest is the guard's own `digest`, which its tests
hold equal to the tool's; the tool itself is not imported (a build of the guard must not need it).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PACKAGE = "vllm_patch_guard"
DATA = "lines.json"
sys.path.insert(0, str(HERE / "src"))
from vllm_patch_guard import digest  # noqa: E402  (the package is the standard library only)


def repository() -> Path | None:
    """The vllm-patch checkout this guard lies in (``guard/`` next to ``series``), or None (an sdist)."""
    root = HERE.parent
    if HERE.name == "guard" and (root / "series").is_file() and (root / "patches").is_dir():
        return root
    return None


def read_line(name: str, root: Path, project: Path | None = None) -> dict:
    """One line's data: name, pinned version, the later releases it is proven on, commit, patches
    (name, sha256), digest. `project` (default `root`, the top-level line's) holds the lines a patch is carried
    from."""
    project = project or root
    fields: dict[str, str] = {}
    names: list[str] = []
    files: dict[str, Path] = {}
    for raw in (root / "series").read_text(encoding="utf-8").splitlines():
        text = raw.strip()
        if text.startswith("#:"):
            key, _, value = text[2:].partition("=")
            fields[key.strip()] = value.strip()
        elif text and not text.startswith("#"):
            words = text.split()
            names.append(words[0])
            if len(words) == 3 and words[1] == "from":  # carried from another line
                line, _, source = words[2].partition("/")
                files[words[0]] = (project if line == "current" else project / "lines" / line) / "patches" / \
                    (source or words[0])
    if "version" not in fields or "commit" not in fields:
        raise SystemExit(f"{root / 'series'}: the pin lacks '#: version' or '#: commit'")
    commit = fields["commit"].lower()
    patches = [(n, files.get(n, root / "patches" / n).read_bytes()) for n in names]
    return {
        "name": name,
        "version": fields["version"],
        "also": fields.get("also", "").split(),
        "commit": commit,
        "patches": [[n, hashlib.sha256(data).hexdigest()] for n, data in patches],
        "digest": digest(fields["version"], commit, patches),
    }


def lines_data(root: Path) -> bytes:
    """Every line of the repository at `root`, as ``vllm_patch.lines.lines_of`` lists them: the
    top-level one (``current``) first, then ``lines/*`` with a series and patches, by name."""
    lines = [read_line("current", root, root)]
    base = root / "lines"
    if base.is_dir():
        lines += [read_line(d.name, d, root) for d in sorted(base.iterdir())
                  if (d / "series").is_file() and (d / "patches").is_dir()]
    return (json.dumps({"lines": lines}, indent=1, sort_keys=True) + "\n").encode("utf-8")


def write_data(package_dir: Path) -> None:
    """Generate ``lines.json`` into `package_dir` from the repository; outside one (an sdist), the
    copy already there must exist."""
    target = package_dir / DATA
    root = repository()
    if root is not None:
        package_dir.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)  # a release tree may hard-link it to the source's copy
        target.write_bytes(lines_data(root))
    elif not target.is_file():
        raise SystemExit(f"vllm-patch-guard: no {DATA} to ship: build the guard inside the vllm-patch repository "
                         f"(its guard/ folder), or from an sdist built there")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            write_data(HERE / "src" / PACKAGE)  # an editable install imports from the source folder
        else:
            write_data(Path(self.build_lib) / PACKAGE)  # outside the repository: the sdist's copy, copied there


class Sdist(sdist):
    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        write_data(Path(base_dir) / "src" / PACKAGE)


if __name__ == "__main__":  # setuptools runs this file as __main__; the tests import it for `lines_data`
    setup(cmdclass={"build_py": BuildPy, "sdist": Sdist}, package_data={PACKAGE: [DATA]})
