"""Obsolete patches: the drop condition a patch carries in its own header.

A patch may name, in ``Obsolete-If:`` trailers (DEP-3 style, in the last paragraph
of its description), checks that a newer vLLM answers. The patch is obsolete on a
base when it has at least one such trailer and every one of them holds there::

    Obsolete-If: vllm/v1/worker/gpu_model_runner.py contains "use_spec_decode = self.speculative_config is not None"
    Obsolete-If: vllm/v1/attention/backends/gdn_attn.py matches "spec_token_indx\\s*=\\s*.*index_select"
    Obsolete-If: test "tests/gdn/test_gdn_builder.py::test_zero_draft_rows"

``contains`` takes a literal text, ``matches`` a Python regular expression
(multi-line mode); both look at the file of that path on the *unpatched* new
base (a path as it is there, not as it was). ``test`` runs a test of this
project with pytest, the new base's tree given to it as ``$VLLM_PATCH_PRISTINE_TREE``
and ``$VLLM_PATCH_PATCHED_TREE``: it must pass (skipped does not count).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..engine.analysis import Contents
from ..engine.patchfile import Patch
from ..errors import InputError

TRAILER = "Obsolete-If"
RE_FILE = re.compile(r"^(?P<path>\S+)\s+(?P<op>contains|matches)\s+(?P<text>.+)$")
RE_TEST = re.compile(r"^test\s+(?P<text>.+)$")


@dataclass(frozen=True)
class Condition:
    """One ``Obsolete-If:`` check."""

    op: str  # "contains", "matches" or "test"
    path: str  # the file looked at ("" for a test)
    text: str  # the literal, the regex or the test's node id
    source: str  # the trailer's value as written

    def describe(self) -> str:
        return f"{TRAILER}: {self.source}"


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r'\\(["\\])', r"\1", text[1:-1])
    return text


def conditions(patch: Patch) -> list[Condition]:
    """The patch's ``Obsolete-If:`` checks; a malformed one is an input error naming the patch."""
    found = []
    for key, value in patch.trailers:
        if key.lower() != TRAILER.lower():
            continue
        m = RE_TEST.match(value)
        if m:
            found.append(Condition("test", "", _unquote(m.group("text")), value))
            continue
        m = RE_FILE.match(value)
        if not m:
            raise InputError(f"{patch.name}: malformed '{TRAILER}: {value}': expected 'PATH contains \"TEXT\"', "
                             "'PATH matches \"REGEX\"' or 'test \"NODEID\"'")
        cond = Condition(m.group("op"), m.group("path"), _unquote(m.group("text")), value)
        if cond.op == "matches":
            try:
                re.compile(cond.text)
            except re.error as exc:
                raise InputError(f"{patch.name}: '{TRAILER}: {value}': bad regular expression: {exc}") from None
        found.append(cond)
    return found


TestRunner = Callable[[str], "tuple[bool, str]"]


class Judge:
    """Answers the patches' obsolete checks on one unpatched base."""

    def __init__(self, read: Callable[[list[str]], Contents], run_test: TestRunner | None = None) -> None:
        self.read = read
        self.run_test = run_test
        self._tests: dict[str, tuple[bool, str]] = {}

    def holds(self, cond: Condition) -> tuple[bool, str]:
        if cond.op == "test":
            if self.run_test is None:
                return False, "tests are not run here"
            if cond.text not in self._tests:
                self._tests[cond.text] = self.run_test(cond.text)
            return self._tests[cond.text]
        data = self.read([cond.path]).get(cond.path)
        if data is None:
            return False, f"{cond.path} does not exist"
        text = data.decode("utf-8", "replace")
        ok = cond.text in text if cond.op == "contains" else re.search(cond.text, text, re.M) is not None
        return ok, f"{cond.path} {cond.op} {cond.text!r}" if ok else f"{cond.path} lacks it"

    def obsolete(self, patch: Patch) -> str | None:
        """Why `patch` is obsolete on this base (every check holds), or None."""
        conds = conditions(patch)
        if not conds:
            return None
        for cond in conds:
            if not self.holds(cond)[0]:
                return None
        return "; ".join(c.describe() for c in conds)


def project_test_runner(project: Path, tree: Callable[[], Path]) -> TestRunner:
    """Runs one of the project's tests with pytest on the unpatched tree `tree()` (made on first use)."""
    def run(node: str) -> tuple[bool, str]:
        root = tree()
        with tempfile.TemporaryDirectory(prefix="vllm-patch-obsolete-") as tmp:
            report = Path(tmp) / "junit.xml"
            env = {**os.environ, "VLLM_PATCH_PRISTINE_TREE": str(root), "VLLM_PATCH_PATCHED_TREE": str(root)}
            try:
                subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                                node], cwd=project, env=env, capture_output=True, timeout=600)
                suite = ET.parse(report).getroot()
            except (OSError, subprocess.TimeoutExpired, ET.ParseError) as exc:
                return False, f"test {node} did not run ({type(exc).__name__})"
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")} if suite is not None \
            else {"tests": 0}
        ok = counts.get("tests", 0) > 0 and not any(counts.get(k, 0) for k in ("failures", "errors", "skipped"))
        return ok, f"test {node}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
    return run
