"""What a launch of the multi-query kernels would compile, without a GPU.

``record_launches(mod, monkeypatch)`` stands in for the three Triton kernels of the verify kernel file (the
verify kernel, the merge of its splits, the query rotation), or for the ``kernels`` named (the decode kernel
file's two: ``DECODE_KERNELS``), into one ``recorder`` if given: each launch the file's code makes
(``kernel[grid](...)`` and the compile-only ``kernel.warmup(..., grid=...)`` alike) is bound by Triton's own
binder for a CUDA target (``create_function_from_signature``: the specialization the JIT computes at a launch:
argument types, 16-byte divisibility, ints equal to 1, constexpr values, ``do_not_specialize``), and its compile
key (kernel, specialization, options) is recorded; nothing runs. Two launches with the same key run the same
compiled kernel, so the keys serving launches produce that the route's probes did not are kernels serving would
compile. ``compile_launches`` compiles recorded launches ahead of time for a target (tq_mq_aot.py, in an
interpreter of its own: this one interprets).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

KERNELS = ("_tq_mq_verify_fwd", "_tq_mq_verify_reduce", "_tq_mq_rotate_queries")
DECODE_KERNELS = ("_tq_decode_stage1", "_fwd_kernel_stage2")


@dataclass(frozen=True)
class Launch:
    kernel: str
    specialization: tuple
    options: tuple

    def as_json(self) -> list:
        return [self.kernel, [list(s) for s in self.specialization], dict(self.options)]


@dataclass
class Recorder:
    launches: list[Launch] = field(default_factory=list)

    def keys(self) -> set[Launch]:
        return set(self.launches)


class _Kernel:
    def __init__(self, name: str, binder, recorder: Recorder):
        self.name, self.binder, self.recorder = name, binder, recorder

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            _, specialization, options = self.binder(*args, **kwargs)
            spec = tuple((ty, v) for ty, v in specialization)
            self.recorder.launches.append(Launch(self.name, spec, tuple(sorted(options.items()))))

        return launch

    def warmup(self, *args, grid, **kwargs):
        """Triton's compile without a launch binds as a launch does: the same key."""
        self[grid](*args, **kwargs)


def record_launches(mod, monkeypatch, capability: int = 90, kernels: tuple[str, ...] = KERNELS,
                    recorder: Recorder | None = None) -> Recorder:
    """Replace mod's kernels by recorders binding for CUDA sm_<capability>; returns the record."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    backend = make_backend(GPUTarget("cuda", capability, 32))
    recorder = Recorder() if recorder is None else recorder
    for name in kernels:
        kernel = getattr(mod, name)
        # Interpreted (TRITON_INTERPRET=1) the decorator's arguments are kept aside; compiled, it is the JIT itself.
        jit = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)
        binder = create_function_from_signature(jit.signature, jit.params, backend)
        monkeypatch.setattr(mod, name, _Kernel(name, binder, recorder))
    return recorder


def compile_launches(kernel_file: Path, target: str, launches: list[Launch]) -> list[dict]:
    """Each launch compiled ahead of time for target (gpu/fit/fitmatrix.py's TARGET names): ``{"shared": bytes,
    ...}`` or ``{"error": ...}`` in order."""
    script = Path(__file__).with_name("tq_mq_aot.py")
    proc = subprocess.run([sys.executable, str(script), str(kernel_file), target, "--launches"],
                          input=json.dumps([launch.as_json() for launch in launches]),
                          capture_output=True, text=True, env=_without_interpreter(), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _without_interpreter() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
