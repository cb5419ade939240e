"""vLLM's kernel files loaded from an installed vLLM (or an unpacked tree) without importing ``vllm``.

Importing ``vllm`` runs its ``__init__`` and through it the platform, config and custom-op machinery; the
doctor needs three Triton files. Each tree gets a private top-level package name
(``_vllm_patch_doctor_tree_<hash>``); its files load as ``<that>.vllm.<...>``, and a loaded file's
``import vllm.x`` / ``from vllm.x import y`` go to the same tree through the module's own ``__import__``.
Package ``__init__`` files are not run. ``vllm.triton_utils`` and ``vllm.platforms`` are small shims
(their real versions import ``vllm.envs`` and more); every other module is the tree's own file.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

PREFIX = "_vllm_patch_doctor_tree_"
_trees: dict[str, Path] = {}
_real_import = builtins.__import__


class Platform:
    """Stands in for ``vllm.platforms.current_platform``: what the TurboQuant kernel files ask."""

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda.is_available()
        self.hip = torch.version.hip is not None
        self.device_type = "cuda" if self.cuda else "cpu"

    def is_cuda_alike(self) -> bool:
        return self.cuda

    def is_cuda(self) -> bool:
        return self.cuda and not self.hip

    def is_rocm(self) -> bool:
        return self.cuda and self.hip

    def is_cpu(self) -> bool:
        return not self.cuda

    def is_xpu(self) -> bool:
        return False

    def get_device_capability(self, device_id: int = 0):
        import torch

        return torch.cuda.get_device_capability(device_id) if self.cuda else None


def _shim_triton_utils(module: ModuleType) -> None:
    import triton
    import triton.language as tl

    module.__dict__.update(HAS_TRITON=True, triton=triton, tl=tl)


def _shim_platforms(module: ModuleType) -> None:
    module.current_platform = Platform()


def _shim_logger(module: ModuleType) -> None:
    module.init_logger = logging.getLogger


SHIMS: dict[str, Callable[[ModuleType], None]] = {
    "vllm.triton_utils": _shim_triton_utils,
    "vllm.platforms": _shim_platforms,
    "vllm.logger": _shim_logger,
}


def _tree_import(top: str) -> Callable[..., ModuleType]:
    def _import(name: str, globals=None, locals=None, fromlist=(), level: int = 0) -> ModuleType:
        if level == 0 and (name == "vllm" or name.startswith("vllm.")):
            module = _real_import(f"{top}.{name}", globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[f"{top}.vllm"]
        return _real_import(name, globals, locals, fromlist, level)

    return _import


class _Loader(importlib.abc.Loader):
    def __init__(self, top: str, path: Path | None = None, shim: Callable[[ModuleType], None] | None = None):
        self.top, self.path, self.shim = top, path, shim

    def create_module(self, spec):
        return None

    def exec_module(self, module: ModuleType) -> None:
        if self.shim is not None:
            self.shim(module)
            return
        if self.path is None:  # a package: its __init__.py is not run
            return
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _tree_import(self.top)}
        exec(compile(self.path.read_bytes(), str(self.path), "exec", dont_inherit=True), module.__dict__)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path=None, target=None):
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
        shim = SHIMS.get(rest)
        base = root.joinpath(*rest.split("."))
        if base.is_dir() or any(name.startswith(rest + ".") for name in SHIMS):
            spec = importlib.machinery.ModuleSpec(fullname, _Loader(top, shim=shim), is_package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        if shim is not None:
            return importlib.machinery.ModuleSpec(fullname, _Loader(top, shim=shim))
        source = base.with_suffix(".py")
        if source.is_file():
            spec = importlib.machinery.ModuleSpec(fullname, _Loader(top, source), origin=str(source))
            spec.has_location = True
            return spec
        return None


def load_module(root: Path, relpath: str) -> ModuleType:
    """The module ``relpath`` (``vllm/.../name.py``) of the tree or site-packages ``root``."""
    rel = Path(relpath)
    if rel.is_absolute() or rel.suffix != ".py" or rel.parts[0] != "vllm" or ".." in rel.parts:
        raise ValueError(f"expected a path like vllm/.../name.py, got {relpath!r}")
    root = Path(root).resolve()
    top = PREFIX + hashlib.sha1(str(root).encode()).hexdigest()[:12]
    _trees[top] = root
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return importlib.import_module(".".join((top, *rel.with_suffix("").parts)))
