"""``vllm-patch doctor``: what a user pastes into a report to prove the line on their own GPU.

The room's modules: ``install`` (the vLLM found, the line covering it and each patch's state, the guard,
the environment the line reads), ``geometry`` (the attention shapes: the default model's or a config.json's,
per tensor-parallel rank), ``runner`` (the probe run in the target interpreter), ``probe/`` (what runs
there: ``gpu`` facts, the ``routes`` the installed planner takes, the kernel ``check`` against a float64
``reference`` and the release's route, with timings; ``tree`` loads the installed kernel files without
importing vLLM), and ``render`` (the text and the JSON, which holds no path of the machine beyond those
given). ``diagnose`` puts them together; ``operations.doctor`` calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EXIT_OK, EXIT_PATCH_FAILED, EXIT_USAGE
from ..locate import SeriesHome
from ..targets.base import Target
from . import geometry
from .install import Install, examine
from .runner import run_probe

PRESETS = ("k8v4", "4bit_nc", "k3v4_nc", "3bit_nc")
K1S = (1, 2, 3, 4)
# The block size of the route's probe launches and of the check's cache (vLLM's default for attention).
BLOCK_SIZE = 16
# Under the interpreter (CPU): smaller pages, so the check's requests still cross them.
INTERPRET_BLOCK_SIZE = 8


@dataclass
class Diagnosis:
    """Everything the doctor found, for the text, the JSON and the exit code."""

    python: str | None  # as given with --python (None: the tool's own interpreter)
    target: str | None  # as given with --target
    model_dir: str | None  # as given with --model
    install: Install
    model: geometry.Model
    interpret: bool = False
    assumed: dict | None = None
    runtime: dict | None = None
    gpus: list[dict] = field(default_factory=list)
    no_gpu: str | None = None
    routes: list[dict] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    timings: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    skipped: str | None = None
    check_k1: int = max(K1S)
    root: Path | None = None  # where the vLLM is (never printed in the JSON)

    @property
    def environment_error(self) -> bool:
        """The probe could not tell about the interpreter or its GPUs (it would not start, has no torch, ...)."""
        return self.runtime is None or any(e["during"] == "environment" for e in self.errors)

    @property
    def kernel_failed(self) -> bool:
        """A check gave a wrong result, or the installed kernels failed to load or run (the probe died)."""
        return any(not c.get("ok") for c in self.checks) or any(e["during"] == "kernels" for e in self.errors)

    @property
    def exit_code(self) -> int:
        if not self.install.fully_applied or self.kernel_failed:
            return EXIT_PATCH_FAILED
        if self.environment_error:
            return EXIT_USAGE
        return EXIT_OK


def _shapes(model: geometry.Model) -> list[tuple[int, int]]:
    return list(dict.fromkeys((g.group, g.head_dim) for g in model.geometries))


def diagnose(home: SeriesHome, target: Target, where: str, fix: str, probe_python: str, *,
             python: str | None = None, target_arg: str | None = None, model_dir: Path | None = None,
             tps: tuple[int, ...] = geometry.DEFAULT_TP, device: int | None = None, interpret: bool = False,
             assumed: dict | None = None, presets: tuple[str, ...] = PRESETS, check: bool = True,
             timing: bool = True, line: str | None = None, wait: float = 0.0,
             progress: Callable[[str], None] = lambda text: None) -> Diagnosis:
    """The install, then the probe in `probe_python`: its runtime and GPUs, the routes, the check."""
    progress("reading the install")
    install = examine(home, target, where, fix, line, wait)
    model = geometry.model(model_dir, tps)
    found = Diagnosis(python, target_arg, str(model_dir) if model_dir else None, install, model, interpret, assumed,
                      root=target.root)
    if install.line is None:
        found.skipped = "no release line covers this vLLM: nothing of the line to plan or check"
    elif not install.kernel_installed:
        found.skipped = "the line's multi-query kernel is not installed: vLLM takes the release's routes"
    first = model.geometries[0]
    request = {
        "root": str(target.root), "routes": found.skipped is None, "check": check and assumed is None,
        "timing": timing, "interpret": interpret, "device": device, "limits": assumed,
        "shapes": _shapes(model), "presets": list(presets), "k1s": list(K1S), "check_k1": found.check_k1,
        "check_heads": [first.num_heads, first.num_kv_heads, first.head_dim], "dtype": model.dtype,
        "block_size": INTERPRET_BLOCK_SIZE if interpret else BLOCK_SIZE,
    }
    progress(f"starting {probe_python}")

    def on_event(event: dict) -> None:
        if event.get("event") == "progress":
            progress(event["text"])

    kernels = False  # whether the probe has started on the installed kernels
    for event in run_probe(probe_python, request, on_event, interpret):
        kind = event.get("event")
        kernels = kernels or kind in ("progress", "routes", "check", "timing")
        if kind == "runtime":
            found.runtime = event["runtime"]
        elif kind == "gpus":
            found.gpus, found.no_gpu = event["gpus"], event["no_gpu"]
        elif kind == "routes":
            found.routes.append({k: v for k, v in event.items() if k != "event"})
        elif kind == "check":
            found.checks.append({"device": event["device"], "heads": event["heads"], **event["result"]})
        elif kind == "timing":
            found.timings.append({k: v for k, v in event.items() if k != "event"})
        elif kind == "error":
            found.errors.append({"stage": event.get("stage"), "message": event.get("message", ""),
                                 "during": "kernels" if kernels else "environment"})
    return found
