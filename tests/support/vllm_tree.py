"""Load vLLM's Triton kernel modules from a source tree without importing the ``vllm`` package.

Importing ``vllm`` runs its ``__init__`` and, through ``vllm.triton_utils``/``vllm.platforms``,
``vllm.envs``, the config system and the custom-op registry: a whole GPU stack that kernel tests do
not need. Here each tree (any directory holding ``vllm/``: an sdist, an unpacked wheel, a patched
copy) gets its own top-level package name, ``_vllm_tree_<hash>``, and its files are loaded as
``_vllm_tree_<hash>.vllm.<...>``. A loaded file's ``import vllm.x`` statements are sent to the same
tree by giving the module its own ``__import__`` (through its ``__builtins__``), so two trees, say the
pristine and the patched one, live side by side in one process and never see each other's modules.

Package ``__init__`` files are not run (they are what pulls the world in); packages are empty
namespaces. A few modules are replaced by small shims (``SHIMS``); every other ``vllm.*`` module a
kernel file imports is the tree's own file.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["SHIMS", "GridOnLaunchArgs", "interpreted", "load_function", "load_module", "package_name"]

_PREFIX = "_vllm_tree_"
_trees: dict[str, Path] = {}  # top-level package name -> tree root
_real_import = builtins.__import__


class _Platform:
    """Stands in for ``vllm.platforms.current_platform``: what the kernel files ask at import and launch.

    It reports CUDA only when a CUDA device is there: the TurboQuant kernels call
    ``torch.cuda.get_device_capability()`` when ``is_cuda_alike()`` is true, which fails on a CPU host.
    """

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.device_type = "cuda" if self.cuda else "cpu"
        self.device_name = self.device_type
        self.dispatch_key = "CUDA" if self.cuda else "CPU"

    def is_cuda(self) -> bool:
        return self.cuda

    def is_cuda_alike(self) -> bool:
        return self.cuda

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return not self.cuda

    def get_device_capability(self, device_id: int = 0) -> tuple[int, int] | None:
        return torch.cuda.get_device_capability(device_id) if self.cuda else None

    def has_device_capability(self, capability: int | tuple[int, int], device_id: int = 0) -> bool:
        cap = self.get_device_capability(device_id)
        if cap is None:
            return False
        want = capability if isinstance(capability, tuple) else divmod(capability, 10)
        return cap >= want

    def is_device_capability(self, capability: int | tuple[int, int], device_id: int = 0) -> bool:
        cap = self.get_device_capability(device_id)
        want = capability if isinstance(capability, tuple) else divmod(capability, 10)
        return cap == want

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn

    def is_pin_memory_available(self) -> bool:
        return False


def _shim_triton_utils(module: ModuleType) -> None:
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    module.__dict__.update(HAS_TRITON=True, triton=triton, tl=tl, tldevice=tldevice,
                           LOG2E=1.4426950408889634, LOGE2=0.6931471805599453)


def _shim_triton_importing(module: ModuleType) -> None:
    # vllm/utils/jit_monitor.py asks whether Triton is there (the real module asks vllm's installed version).
    module.HAS_TRITON = True


def _shim_platforms(module: ModuleType) -> None:
    module.current_platform = _Platform()


def _shim_backend_utils(module: ModuleType) -> None:
    # The same values as vllm/v1/attention/backends/utils.py.
    module.PAD_SLOT_ID = -1
    module.NULL_BLOCK_ID = 0


def _shim_logger(module: ModuleType) -> None:
    module.init_logger = logging.getLogger
    module.logger = logging.getLogger("vllm")


SHIMS: dict[str, Callable[[ModuleType], None]] = {
    "vllm.triton_utils": _shim_triton_utils,
    "vllm.triton_utils.importing": _shim_triton_importing,
    "vllm.platforms": _shim_platforms,
    "vllm.v1.attention.backends.utils": _shim_backend_utils,
    "vllm.logger": _shim_logger,
}
"""Modules replaced by shims (their real versions import ``vllm.envs`` and more), by dotted name."""


def _late_bound_tl_aliases(module: ModuleType) -> None:
    """fla's ``op.py`` binds ``exp = tl.exp`` (and ``log``, ``log2``) at import. The interpreter swaps in
    its own versions of ``tl``'s functions only while a kernel runs, so under it these aliases must look
    the function up at call time; compiled kernels keep the originals."""
    if not interpreted():
        return
    tl = module.tl
    for name in ("exp", "log", "log2"):
        module.__dict__[name] = (lambda attr: lambda *args, **kwargs: getattr(tl, attr)(*args, **kwargs))(name)


AFTER_EXEC: dict[str, Callable[[ModuleType], None]] = {
    "vllm.model_executor.layers.fla.ops.op": _late_bound_tl_aliases,  # up to 0.25
    "vllm.third_party.flash_linear_attention.ops.op": _late_bound_tl_aliases,  # 0.26 and later
}
"""Adjustments made to a source module right after it runs, by dotted name."""


def package_name(tree: Path) -> str:
    """The top-level package name this tree's modules live under (registers the tree)."""
    root = Path(tree).resolve()
    if not (root / "vllm").is_dir():
        raise FileNotFoundError(f"{root} holds no vllm/ directory")
    name = _PREFIX + hashlib.sha1(str(root).encode()).hexdigest()[:12]
    _trees[name] = root
    return name


def _tree_import(top: str) -> Callable[..., ModuleType]:
    """An ``__import__`` that resolves absolute ``vllm``/``vllm.*`` names inside the tree ``top``."""

    def _import(name: str, globals=None, locals=None, fromlist=(), level: int = 0) -> ModuleType:
        if level == 0 and (name == "vllm" or name.startswith("vllm.")):
            module = _real_import(f"{top}.{name}", globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[f"{top}.vllm"]
        return _real_import(name, globals, locals, fromlist, level)

    return _import


class _Loader(importlib.abc.Loader):
    """Creates a tree's packages (empty), shims, and source modules (run with the tree's ``__import__``)."""

    def __init__(self, top: str, path: Path | None = None, shim: Callable[[ModuleType], None] | None = None,
                 after: Callable[[ModuleType], None] | None = None):
        self.top, self.path, self.shim, self.after = top, path, shim, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        if self.shim is not None:
            self.shim(module)
            return
        if self.path is None:  # a package: its __init__.py is not run
            return
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _tree_import(self.top)}
        code = compile(self.path.read_bytes(), str(self.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)
        if self.after is not None:
            self.after(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``_vllm_tree_<hash>[.vllm[...]]`` modules in the registered trees."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        top, _, rest = fullname.partition(".")
        root = _trees.get(top)
        if root is None:
            return None
        if not rest:
            spec = importlib.machinery.ModuleSpec(fullname, _Loader(top), is_package=True)
            spec.submodule_search_locations = [str(root)]
            return spec
        if rest != "vllm" and not rest.startswith("vllm."):
            return None
        base = root.joinpath(*rest.split("."))
        shim = SHIMS.get(rest)
        if base.is_dir() or any(name.startswith(rest + ".") for name in SHIMS):
            spec = importlib.machinery.ModuleSpec(fullname, _Loader(top, shim=shim), is_package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        source = base.with_suffix(".py")
        if shim is not None:
            return importlib.machinery.ModuleSpec(fullname, _Loader(top, shim=shim))
        if source.is_file():
            loader = _Loader(top, source, after=AFTER_EXEC.get(rest))
            spec = importlib.machinery.ModuleSpec(fullname, loader, origin=str(source))
            spec.has_location = True
            return spec
        return None


def _install_finder() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def interpreted() -> bool:
    """Whether Triton kernels run under the interpreter (``TRITON_INTERPRET=1``, set on CPU hosts)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def load_module(tree: Path, relpath: str) -> ModuleType:
    """The module ``relpath`` (e.g. ``vllm/v1/attention/ops/triton_turboquant_decode.py``) of ``tree``.

    Loaded once per (tree, relpath): later calls return the same module object.
    """
    rel = Path(relpath)
    if rel.is_absolute() or rel.suffix != ".py" or rel.parts[0] != "vllm" or ".." in rel.parts:
        raise ValueError(f"expected a path like vllm/.../name.py, got {relpath!r}")
    _install_finder()
    top = package_name(tree)
    dotted = ".".join(rel.with_suffix("").parts)
    return importlib.import_module(f"{top}.{dotted}")


def load_function(tree: Path, relpath: str, qualname: str, **names: object) -> Callable:
    """One function (``name`` or ``Class.method``) of a tree's file, compiled and run on its own.

    For code in files that cannot be loaded without the whole of vLLM (a layer's ``__init__`` helpers,
    say): only the function's own statements run, its ``import vllm...`` statements resolve in the tree
    (as in ``load_module``), and the module-level names it uses must be given as ``names``.
    """
    path = Path(tree).resolve() / relpath
    found: ast.AST = ast.parse(path.read_bytes(), str(path))
    for part in qualname.split("."):
        body = getattr(found, "body", [])
        matches = [n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part]
        if not matches:
            raise LookupError(f"no {qualname} in {path}")
        found = matches[0]
    if not isinstance(found, ast.FunctionDef):
        raise LookupError(f"{qualname} in {path} is not a function")
    _install_finder()
    scope: dict = {"__builtins__": {**builtins.__dict__, "__import__": _tree_import(package_name(tree))}, **names}
    exec(compile(ast.Module(body=[found], type_ignores=[]), str(path), "exec"), scope)
    return scope[found.name]


class GridOnLaunchArgs:
    """Wraps a Triton kernel so a callable grid sees the launch's own arguments, as on a GPU.

    On a GPU, Triton calls ``grid(args)`` with the bound launch arguments (torch tensors) and then
    launches with those same, possibly reassigned, arguments. vLLM's ``causal_conv1d_fn`` relies on it:
    its grid callable fills the ``batch_ptr``/``token_chunk_offset_ptr`` tensors it receives. Triton's
    interpreter hands the grid its own pointer objects instead, so that fails. This wrapper evaluates
    the grid on the torch arguments first and launches with a fixed grid. Use it under the interpreter
    only (``monkeypatch.setattr(module, name, GridOnLaunchArgs(kernel))``).
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.arg_names: list[str] = list(kernel.arg_names)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if not callable(grid):
                return self.kernel[grid](*args, **kwargs)
            meta = dict(zip(self.arg_names[: len(args)], args, strict=True))
            meta.update({k: v for k, v in kwargs.items() if k in self.arg_names})
            options = {k: v for k, v in kwargs.items() if k not in self.arg_names}
            fixed = tuple(grid(meta))
            return self.kernel[fixed](**{k: meta[k] for k in self.arg_names if k in meta}, **options)

        return launch
