"""The build step that makes the installed tool self-contained: the release lines (``series``,
``patches/``, ``lines/NAME/{series,patches/}``) are copied into the built package as
``vllm_patch/_lines``, read at run time with importlib.resources. They are generated at build
time from the checkout (or the sdist, which MANIFEST.in makes carry them): one source of
truth, nothing copied into git. An editable install reads the checkout itself."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
BUNDLE = "_lines"  # tool/vllm_patch/bundled.py reads it under this name


def series_dirs(root: Path) -> list[Path]:
    """The series directories to ship: the top-level one and each ``lines/NAME``."""
    lines = sorted(d for d in (root / "lines").glob("*") if (d / "series").is_file()) if (root / "lines").is_dir() \
        else []
    return [root, *lines]


class BuildWithLines(build_py):
    """build_py, then the release lines into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False) or not (HERE / "series").is_file():
            return
        dest = Path(self.build_lib) / "vllm_patch" / BUNDLE
        shutil.rmtree(dest, ignore_errors=True)
        for src in series_dirs(HERE):
            to = dest / src.relative_to(HERE)
            to.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / "series", to / "series")
            for patch in sorted((src / "patches").glob("*")):
                if patch.is_file():
                    (to / "patches").mkdir(exist_ok=True)
                    shutil.copyfile(patch, to / "patches" / patch.name)


setup(cmdclass={"build_py": BuildWithLines})
