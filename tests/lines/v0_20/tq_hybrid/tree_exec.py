"""Run pieces of vLLM's config and KV-cache planning code from a source tree, without the ``vllm`` package.

``vllm_tree.load_module`` (tests/lines/v0_20/kernels) loads a file whose imports are all loadable on their own.
The code this directory tests is not in such files: the TurboQuant skip list is computed inside
``EngineArgs.create_engine_config``, the hybrid page alignment is a method of ``Platform``, the
KV cache grouping lives in ``kv_cache_utils`` next to the request and hashing machinery. So:

- ``exec_module`` runs a whole file with an ``__import__`` that serves the given fakes, loads the
  light ``vllm.*`` modules the planning code really needs (``REAL``) from the same tree, and hands
  any other ``vllm.*`` import an inert placeholder module (its attributes are empty classes);
- ``exec_function`` compiles single functions (or methods, ``Class.name``) out of a file, with the
  same ``__import__`` for the imports inside them;
- ``exec_block`` runs one statement of a function body (found by a predicate) in a namespace the test
  fills.

Every piece of vLLM code runs as the tree has it: pristine or patched, never a copy in this file.
"""

from __future__ import annotations

import ast
import builtins
import itertools
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from vllm_tree import load_module

REAL = (
    "vllm.logger",  # vllm_tree's shim
    "vllm.utils.math_utils",
    "vllm.utils.torch_utils",
    "vllm.v1.kv_cache_interface",
    "vllm.model_executor.layers.quantization.turboquant.config",
)
"""``vllm.*`` modules loaded from the tree itself (they import nothing heavy)."""

_counter = itertools.count()


class Placeholder(ModuleType):
    """A stand-in module: any attribute is a fresh empty class named after it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


def tree_import(tree: Path, fakes: dict[str, ModuleType] | None = None) -> Callable[..., Any]:
    """An ``__import__`` for code of ``tree``: fakes first, then ``REAL`` modules, else placeholders."""
    fakes = dict(fakes or {})
    placeholders: dict[str, ModuleType] = {}

    def _import(name: str, globals=None, locals=None, fromlist=(), level: int = 0) -> Any:
        if level != 0 or not (name == "vllm" or name.startswith("vllm.")):
            return builtins.__import__(name, globals, locals, fromlist, level)
        if name in fakes:
            return fakes[name]
        if name in REAL:
            return load_module(tree, name.replace(".", "/") + ".py")
        if name not in placeholders:
            placeholders[name] = Placeholder(name)
        return placeholders[name]

    return _import


def _namespace(tree: Path, name: str, fakes: dict[str, ModuleType] | None, extra: dict[str, Any] | None):
    builtins_ = {**builtins.__dict__, "__import__": tree_import(tree, fakes)}
    ns: dict[str, Any] = {"__name__": name, "__builtins__": builtins_}
    ns.update(extra or {})
    return ns


def exec_module(tree: Path, relpath: str, fakes: dict[str, ModuleType] | None = None) -> ModuleType:
    """Run the file ``relpath`` of ``tree`` as a fresh module, registered in ``sys.modules`` under a name of
    its own (dataclasses look their module up there)."""
    path = Path(tree) / relpath
    name = f"_tq_hybrid_exec_{next(_counter)}." + relpath.replace("/", ".").removesuffix(".py")
    module = ModuleType(name)
    module.__dict__.update(_namespace(tree, name, fakes, {"__file__": str(path)}))
    sys.modules[name] = module
    exec(compile(path.read_text(), str(path), "exec", dont_inherit=True), module.__dict__)
    return module


def _find_function(tree_ast: ast.Module, qualname: str) -> ast.FunctionDef:
    scope: Iterable[ast.stmt] = tree_ast.body
    *outer, last = qualname.split(".")
    for cls in outer:
        node = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            raise LookupError(f"no class {cls!r} on the way to {qualname!r}")
        scope = node.body
    fn = next((n for n in scope if isinstance(n, ast.FunctionDef) and n.name == last), None)
    if fn is None:
        raise LookupError(f"no function {qualname!r}")
    return fn


def has_function(tree: Path, relpath: str, qualname: str) -> bool:
    try:
        _find_function(ast.parse((Path(tree) / relpath).read_text()), qualname)
    except LookupError:
        return False
    return True


def exec_function(tree: Path, relpath: str, qualnames: Iterable[str], fakes: dict[str, ModuleType] | None = None,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compile the named functions of one file into one namespace, after the file's top-level imports;
    methods become plain functions (decorators dropped) under their bare names. Returns the namespace."""
    path = Path(tree) / relpath
    source = path.read_text()
    parsed = ast.parse(source)
    ns = _namespace(tree, "_tq_hybrid_exec.functions", fakes, None)
    # The file's own top-level imports (through the same __import__), then the caller's names over them.
    imports = [n for n in parsed.body if isinstance(n, ast.Import)
               or (isinstance(n, ast.ImportFrom) and n.module != "__future__")]
    exec(compile(ast.Module(body=imports, type_ignores=[]), str(path), "exec", dont_inherit=True), ns)
    ns.update(extra or {})
    for qualname in qualnames:
        fn = _find_function(parsed, qualname)
        fn.decorator_list = []
        mod = ast.Module(body=[fn], type_ignores=[])
        exec(compile(mod, str(path), "exec", dont_inherit=True), ns)
    return ns


def find_statement(tree: Path, relpath: str, qualname: str, predicate: Callable[[ast.stmt, str], bool]) -> ast.stmt:
    """The first statement (depth-first, in source order) of function ``qualname`` that ``predicate`` accepts;
    the predicate gets the node and its source text."""
    path = Path(tree) / relpath
    source = path.read_text()
    fn = _find_function(ast.parse(source), qualname)
    for node in ast.walk(fn):
        if isinstance(node, ast.stmt) and node is not fn \
                and predicate(node, ast.get_source_segment(source, node) or ""):
            return node
    raise LookupError(f"no matching statement in {qualname!r} of {relpath}")


def exec_block(tree: Path, relpath: str, node: ast.stmt, ns: dict[str, Any],
               fakes: dict[str, ModuleType] | None = None) -> dict[str, Any]:
    """Run one statement of ``relpath`` (from ``find_statement``) in ``ns`` (updated in place)."""
    path = Path(tree) / relpath
    segment = ast.get_source_segment(path.read_text(), node)
    assert segment is not None
    # get_source_segment drops the first line's indentation only; re-indent it to dedent as a whole.
    code = textwrap.dedent(" " * node.col_offset + segment)
    ns.update(_namespace(tree, "_tq_hybrid_exec.block", fakes, {k: v for k, v in ns.items() if k != "__builtins__"}))
    exec(compile(code, str(path), "exec", dont_inherit=True), ns)
    return ns
