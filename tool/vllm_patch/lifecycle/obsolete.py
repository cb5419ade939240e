"""Obsolete patches: the drop condition a patch carries in its own header.

A patch may name, in ``Obsolete-If:`` trailers (DEP-3 style, in the last paragraph
of its description), checks that a newer vLLM answers. The patch is obsolete on a
base when it has at least one such trailer and every one of them holds there::

    Obsolete-If: vllm/v1/worker/gpu_model_runner.py contains "use_spec_decode = self.speculative_config is not None"
    Obsolete-If: vllm/v1/attention/backends/gdn_attn.py matches "spec_token_indx\\s*=\\s*.*index_select"
    Obsolete-If: test "tests/lines/v0_20/gdn/test_gdn_builder.py::test_zero_draft_rows"

A patch that does more than one thing names its parts: a check may begin with a
part in brackets, ``Obsolete-If: [graph safety] test "tests/...::test_x"``; checks
without one belong to the part named ``whole``. A part holds when every one of its
checks holds; the patch is obsolete when every part holds, and *partly obsolete*
when some do (``outlook`` and ``rebase`` then carry it as usual and name the parts
upstream has made unnecessary, so a maintainer can trim or split it).

``contains`` takes a literal text, ``matches`` a Python regular expression
(multi-line mode); both look at the file of that path on the *unpatched* new
base (a path as it is there, not as it was). ``test`` runs a test of this
project with pytest, the new base's tree given to it as ``$VLLM_PATCH_BASE_UNDER_TEST``
(and, for the tests of line v0.20, ``$VLLM_PATCH_PRISTINE_TREE`` and
``$VLLM_PATCH_PATCHED_TREE``): it must pass (skipped does not count).

A trailer is input like a patch's paths: a file path that could leave the tree, or a test
that is not a ``.py`` file of the project's own ``tests/`` (absolute, ``..``, a symlink
leading out, a file that does not exist) is refused before anything runs, since ``outlook``
promises to change nothing and a test is code that runs. A test that cannot run (pytest
missing, its node not found, nothing collected) is an error, never a "still needed".

The tests are the project's: an installed tool (the lines bundled as package data, no ``tests/``)
has none, so ``outlook`` there runs the text checks and reports the test checks as not run (their
parts carried as still needed); a checkout whose interpreter lacks what the tests import (pytest,
torch, Triton: ``make dev``) is refused before anything runs, naming that command.
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
from ..engine.patchfile import Patch, check_path
from ..errors import CheckNotRun, InputError
from ..infrastructure.verdict_cache import VerdictCache

TRAILER = "Obsolete-If"
RE_FILE = re.compile(r"^(?P<path>\S+)\s+(?P<op>contains|matches)\s+(?P<text>.+)$")
RE_TEST = re.compile(r"^test\s+(?P<text>.+)$")
RE_PART = re.compile(r"^\[(?P<part>[^\[\]\n]+)\]\s+(?P<rest>.+)$")
WHOLE = "whole"
# What a test check is given: the unpatched new base (tests of every line read it).
BASE_ENV = "VLLM_PATCH_BASE_UNDER_TEST"
TESTS_DIR = "tests"
TEST_TIMEOUT = 600
# What the project's tests import, as its `make dev` environment has them.
TEST_MODULES = ("pytest", "torch", "triton")


@dataclass(frozen=True)
class Condition:
    """One ``Obsolete-If:`` check."""

    op: str  # "contains", "matches" or "test"
    path: str  # the file looked at ("" for a test)
    text: str  # the literal, the regex or the test's node id
    source: str  # the trailer's value as written
    part: str = WHOLE  # what of the patch this check judges

    def describe(self) -> str:
        return f"{TRAILER}: {self.source}"


@dataclass(frozen=True)
class Obsolescence:
    """What a base makes unnecessary of one patch: the parts whose checks all hold, and the rest."""

    held: tuple[str, ...]
    pending: tuple[str, ...]
    reason: str  # the checks of the parts that hold

    @property
    def whole(self) -> bool:
        return bool(self.held) and not self.pending

    def describe(self) -> str:
        """One phrase: what holds, and (partly obsolete) what is still needed."""
        if self.whole:
            return self.reason
        return (f"partly obsolete: {', '.join(self.held)} ({self.reason}); "
                f"still needed: {', '.join(self.pending)}")


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r'\\(["\\])', r"\1", text[1:-1])
    return text


def _test_node(where: str, node: str) -> str:
    """A pytest node id of a ``.py`` file under ``tests/``, relative, with no way out of it."""
    file = node.split("::", 1)[0]
    if not file.startswith(f"{TESTS_DIR}/"):
        raise InputError(f"{where}: a test is a pytest node id of this project's {TESTS_DIR}/ "
                         f"(e.g. {TESTS_DIR}/test_x.py::test_y), not {node!r}")
    check_path(where, file)
    if not file.endswith(".py"):
        raise InputError(f"{where}: a test node names a .py file under {TESTS_DIR}/, not {file!r}")
    return node


def conditions(patch: Patch) -> list[Condition]:
    """The patch's ``Obsolete-If:`` checks; a malformed or unsafe one is an input error naming the patch."""
    found = []
    for key, value in patch.trailers:
        if key.lower() != TRAILER.lower():
            continue
        where = f"{patch.name}: invalid '{TRAILER}: {value}'"
        part, check = WHOLE, value
        labelled = RE_PART.match(value)
        if labelled:
            part, check = " ".join(labelled.group("part").split()), labelled.group("rest")
        m = RE_TEST.match(check)
        if m:
            found.append(Condition("test", "", _test_node(where, _unquote(m.group("text"))), value, part))
            continue
        m = RE_FILE.match(check)
        if not m:
            raise InputError(f"{patch.name}: malformed '{TRAILER}: {value}': expected 'PATH contains \"TEXT\"', "
                             "'PATH matches \"REGEX\"' or 'test \"NODEID\"', after an optional '[PART] '")
        cond = Condition(m.group("op"), check_path(where, m.group("path")), _unquote(m.group("text")), value, part)
        if cond.op == "matches":
            try:
                re.compile(cond.text)
            except re.error as exc:
                raise InputError(f"{patch.name}: '{TRAILER}: {value}': bad regular expression: {exc}") from None
        found.append(cond)
    return found


def test_file(project: Path, node: str, where: str) -> Path:
    """The file of test `node`, which must exist inside the project's ``tests/`` once resolved."""
    tests = (project / TESTS_DIR).resolve()
    rel = _test_node(where, node).split("::", 1)[0]
    path = (project / rel).resolve()
    if not path.is_relative_to(tests):
        raise InputError(f"{where}: {rel} leads outside {tests}")
    if not path.is_file():
        raise InputError(f"{where}: {rel} does not exist in {project}")
    return path


def validate(patches: list[Patch], project: Path | None) -> None:
    """Refuse the series' invalid trailers before anything runs: each parses, and (given the
    project) each test it names is a file of the project's ``tests/``."""
    for patch in patches:
        for cond in conditions(patch):
            if cond.op == "test" and project is not None:
                test_file(project, cond.text, f"{patch.name}: invalid '{cond.describe()}'")


def dev_command(project: Path) -> str:
    """The command that gives `project`'s checkout what its tests need, and the tool to run then."""
    return f"make -C {project} dev, then run {project}/.venv/bin/vllm-patch"


def require_test_environment(project: Path, patches: list[Patch]) -> None:
    """Refuse, before anything runs, test checks this interpreter cannot run: a test that cannot import
    torch would be an error (or a skip, which is no verdict) only after the downloads."""
    import importlib.util

    if not any(c.op == "test" for p in patches for c in conditions(p)):
        return
    missing = [m for m in TEST_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise CheckNotRun(f"the series' Obsolete-If test checks need {', '.join(missing)}, which {sys.executable} "
                          f"lacks: {dev_command(project)}")


TestRunner = Callable[[str], "tuple[bool, str]"]


class Judge:
    """Answers the patches' obsolete checks on one unpatched base."""

    def __init__(self, read: Callable[[list[str]], Contents], run_test: TestRunner | None = None,
                 skip_tests: bool = False) -> None:
        """`skip_tests`: no test can run here (no project tests): a part whose text checks hold but that
        has a test check is then taken as still needed, its test checks listed in `not_run`, instead of
        an error."""
        self.read = read
        self.run_test = run_test
        self.skip_tests = skip_tests
        self.not_run: dict[str, list[str]] = {}  # patch name: the test checks that did not run
        self._tests: dict[str, tuple[bool, str]] = {}

    def holds(self, cond: Condition) -> tuple[bool, str]:
        if cond.op == "test":
            if self.run_test is None:
                raise CheckNotRun(f"'{cond.describe()}' cannot run: no project to run its test in")
            if cond.text not in self._tests:
                self._tests[cond.text] = self.run_test(cond.text)
            return self._tests[cond.text]
        data = self.read([cond.path]).get(cond.path)
        if data is None:
            return False, f"{cond.path} does not exist"
        text = data.decode("utf-8", "replace")
        ok = cond.text in text if cond.op == "contains" else re.search(cond.text, text, re.M) is not None
        return ok, f"{cond.path} {cond.op} {cond.text!r}" if ok else f"{cond.path} lacks it"

    def prepare(self, patches: list[Patch]) -> None:
        """Run the test checks of every patch at once, where the runner can (one pytest run a base)."""
        many = getattr(self.run_test, "many", None)
        nodes = list(dict.fromkeys(c.text for p in patches for c in conditions(p)
                                   if c.op == "test" and c.text not in self._tests))
        if many is None or len(nodes) < 2:
            return
        try:
            self._tests.update(many(nodes))
        except CheckNotRun:
            pass  # one by one, as judged: the error then names the check that cannot run

    def _holds(self, patch: Patch, cond: Condition) -> bool:
        try:
            return self.holds(cond)[0]
        except CheckNotRun as exc:
            raise CheckNotRun(f"{patch.name}: {exc.message}") from None

    def _part_holds(self, patch: Patch, conds: list[Condition]) -> bool:
        if not self.skip_tests:
            return all(self._holds(patch, c) for c in conds)
        tests = [c for c in conds if c.op == "test"]
        if not all(self._holds(patch, c) for c in conds if c.op != "test"):
            return False  # whatever its tests would say
        if tests:
            listed = self.not_run.setdefault(patch.name, [])
            listed += [c.describe() for c in tests if c.describe() not in listed]
        return not tests

    def judge(self, patch: Patch) -> Obsolescence | None:
        """Which parts of `patch` this base makes unnecessary; None when no part does.
        Within a part the checks stop at the first that fails; every part is judged."""
        parts: dict[str, list[Condition]] = {}
        for cond in conditions(patch):
            parts.setdefault(cond.part, []).append(cond)
        held = [name for name, conds in parts.items() if self._part_holds(patch, conds)]
        if not held:
            return None
        reason = "; ".join(c.describe() for name in held for c in parts[name])
        return Obsolescence(tuple(held), tuple(n for n in parts if n not in held), reason)

    def obsolete(self, patch: Patch) -> str | None:
        """Why `patch` is obsolete on this base (every part holds), or None."""
        found = self.judge(patch)
        return found.reason if found is not None and found.whole else None


class ProjectTests:
    """Runs the project's tests with pytest on an unpatched tree (`tree()`, made on first use): one node
    (a callable TestRunner), or many nodes in one pytest run (`many`), since every run pays for the
    interpreter, torch and the tree's imports again. Only files of the project's ``tests/`` run; a run
    that cannot give a verdict raises CheckNotRun. A verdict already given for the same tree, test code
    and environment is taken from the verdict cache (infrastructure/verdict_cache.py) instead of run again."""

    def __init__(self, project: Path, tree: Callable[[], Path], verdicts: VerdictCache | None = None) -> None:
        self.project = project
        self.tree = tree
        self.verdicts = verdicts or VerdictCache()

    def __call__(self, node: str) -> tuple[bool, str]:
        return self.many([node])[node]

    def many(self, nodes: list[str]) -> dict[str, tuple[bool, str]]:
        for node in nodes:
            test_file(self.project, node, f"invalid test {node!r}")
        root = self.tree()
        keys = {node: self.verdicts.key(self.project, root, node) for node in nodes}
        found = {node: self.verdicts.get(key) for node, key in keys.items()}
        done = {node: (v[0], f"{v[1]} (cached verdict)") for node, v in found.items() if v is not None}
        missing = [node for node in nodes if node not in done]
        if missing:
            ran = self._run(root, missing)
            for node, verdict in ran.items():
                self.verdicts.put(keys[node], verdict)
            done.update(ran)
        return {node: done[node] for node in nodes}

    def _run(self, root: Path, nodes: list[str]) -> dict[str, tuple[bool, str]]:
        what = nodes[0] if len(nodes) == 1 else f"{nodes[0]} (+{len(nodes) - 1})"
        with tempfile.TemporaryDirectory(prefix="vllm-patch-obsolete-") as tmp:
            report = Path(tmp) / "junit.xml"
            env = {**os.environ, BASE_ENV: str(root), "VLLM_PATCH_PRISTINE_TREE": str(root),
                   "VLLM_PATCH_PATCHED_TREE": str(root)}
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                       f"--junitxml={report}", *nodes], cwd=self.project, env=env,
                                      capture_output=True, text=True, errors="replace", timeout=TEST_TIMEOUT)
            except OSError as exc:
                raise CheckNotRun(f"test {what} cannot run: {exc.strerror or exc}") from None
            except subprocess.TimeoutExpired:
                raise CheckNotRun(f"test {what} cannot run: it took more than {TEST_TIMEOUT} s") from None
            _ran(what, done, self.project)
            try:
                cases = list(ET.parse(report).getroot().iter("testcase"))
            except (OSError, ET.ParseError) as exc:
                raise CheckNotRun(f"test {what} cannot run: pytest left no report ({exc})") from None
        return {node: _verdict(node, [c for c in cases if _case_of(node, c)]) for node in nodes}


def _case_of(node: str, case: ET.Element) -> bool:
    """Whether a junit testcase is one of node's (``file.py::test`` or ``file.py::Class::test``, every
    parametrization of it; a node naming a file alone takes all the file's cases)."""
    file, *rest = node.split("::")
    module = file.removesuffix(".py").replace("/", ".")
    if not rest:
        return case.get("classname", "") == module or case.get("classname", "").startswith(module + ".")
    classname = ".".join([module, *rest[:-1]])
    name = case.get("name", "")
    return case.get("classname") == classname and (name == rest[-1] or name.startswith(rest[-1] + "["))


def _verdict(node: str, cases: list[ET.Element]) -> tuple[bool, str]:
    if not cases:
        raise CheckNotRun(f"test {node} cannot run: pytest collected no test")
    counts = {k: sum(1 for c in cases if c.find(k) is not None) for k in ("failure", "error", "skipped")}
    ok = not any(counts.values())
    return ok, f"test {node}: {len(cases)} tests, " + ", ".join(f"{v} {k}" for k, v in counts.items())


def project_test_runner(project: Path, tree: Callable[[], Path],
                        verdicts: VerdictCache | None = None) -> ProjectTests:
    """The project's tests on the unpatched tree `tree()` (see ProjectTests), their verdicts kept in
    `verdicts` (default: the user's cache)."""
    return ProjectTests(project, tree, verdicts)


def _ran(node: str, done: subprocess.CompletedProcess, project: Path) -> None:
    """Refuse a pytest run that gave no verdict: exit 0 (passed) and 1 (failed) are verdicts;
    pytest missing, a node not found (4), an interrupted collection (2) or no test (5) are not."""
    text = f"{done.stdout}\n{done.stderr}"
    if done.returncode and "No module named pytest" in text:  # python -m says so with exit 1
        raise CheckNotRun(f"test {node} cannot run: pytest is not installed for {sys.executable}: "
                          f"{dev_command(project)}")
    if done.returncode in (0, 1):
        return
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith(("ERROR", "E "))), lines[-1] if lines else "no output")
    hint = f"; {dev_command(project)}" if "No module named" in text else ""
    raise CheckNotRun(f"test {node} cannot run: pytest exited {done.returncode}: {' '.join(said.split())[:300]}{hint}")
