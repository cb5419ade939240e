"""vLLM's start as far as its plugins go, run by the interpreter of a virtualenv holding the real vLLM wheel
(installed ``--no-deps``, so no torch) and the guard.

``import vllm`` runs ``vllm/__init__.py``, which imports ``vllm.env_override``, which imports torch; the
plugin loader itself (``vllm/plugins/__init__.py``, with ``vllm/envs.py``) needs only the standard library.
So the ``vllm`` package is entered without its ``__init__`` (a bare package module over the same folder),
and what runs is vLLM's own file: ``vllm.plugins.load_general_plugins``, which every vLLM process calls at
start, with ``VLLM_PLUGINS`` read by vLLM's own ``envs``.

    python vllm_start.py               # load_general_plugins(), then print "started"
    python vllm_start.py --child       # and once more in a child process (vLLM's engine and workers)
    python vllm_start.py --bench 20 [MODULE...]  # time the guard's import and entry point in vLLM's loader
                                                 # (MODULEs imported first): JSON on stdout
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import time
import types


def enter_vllm() -> None:
    """Make ``vllm`` importable as a package without running its ``__init__`` (which pulls torch)."""
    spec = importlib.util.find_spec("vllm")
    package = types.ModuleType("vllm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    sys.modules["vllm"] = package


def bench(runs: int, preload: list[str]) -> dict:
    """The guard's cost in vLLM's loader: importing its module where the loader imports it (vllm.plugins and
    importlib.metadata already imported; timed, with the modules it adds), then its entry point, as vLLM's
    loader loads it, called `runs` + 1 times (timed). `preload`: modules to import first (a real vLLM
    process has imported hashlib long before its plugins load)."""
    import importlib
    import importlib.metadata  # noqa: F401  (load_plugins_by_group imports it before loading any plugin)

    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    for name in preload:
        importlib.import_module(name)
    before = set(sys.modules)
    t0 = time.perf_counter()
    importlib.import_module("vllm_patch_guard")
    imported = time.perf_counter() - t0
    figures = {"import_ms": imported * 1e3, "added_modules": sorted(set(sys.modules) - before)}
    func = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)["vllm_patch_guard"]
    times = []
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        func()
        times.append(time.perf_counter() - t0)
    figures.update(first_call_ms=times[0] * 1e3, torch_imported="torch" in sys.modules)
    if runs:
        figures["median_call_ms"] = statistics.median(times[1:]) * 1e3
    return figures


def main(argv: list[str]) -> int:
    enter_vllm()
    if argv[:1] == ["--bench"]:
        print(json.dumps(bench(int(argv[1]), argv[2:])))
        return 0
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    print("started", flush=True)
    if argv[:1] == ["--child"]:
        return subprocess.run([sys.executable, __file__]).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
