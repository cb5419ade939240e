"""Compiles the multi-query verify kernel ahead of time for one CUDA target, in an interpreter of its own.

A test process on a CPU host runs Triton's interpreter (``TRITON_INTERPRET=1``), whose ``triton.language`` can no
longer compile; this script runs without it. It loads a kernel file with gpu/fit/fitmatrix.py
(``load_kernel``: no torch, no vLLM) and compiles ``_tq_mq_verify_fwd`` as the probe launches it
(``fitmatrix.probe_args``, ``fitmatrix.compile_kernel``: ``triton.compile(ASTSource(...),
target=GPUTarget(...))``) for each case read from stdin, a JSON list of ``[block_m, block_n, head_dim, preset,
geometry, k1]``; it prints a JSON list of the results (``{"shared": bytes, ...}`` or ``{"error": ...}``).
With ``--launches`` the cases are launches recorded by launch_keys.py, ``[kernel, specialization, options]``,
each compiled as Triton's JIT would compile it (``fitmatrix.compile_launch``), with the target's FP8 key format.

    python tq_mq_aot.py KERNEL_FILE TARGET [--launches] < cases.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "gpu" / "fit"))

import fitmatrix  # noqa: E402


def main() -> None:
    kernel, target_name = Path(sys.argv[1]), sys.argv[2]
    mod = fitmatrix.load_kernel(kernel)
    target = fitmatrix.TARGET[target_name]
    results = []
    if sys.argv[3:] == ["--launches"]:
        for kernel_name, specialization, options in json.load(sys.stdin):
            # The FP8 key format is the device's (_use_fp8_e4b15): a launch recorded on the host has none.
            names = getattr(mod, kernel_name).arg_names
            if "FP8_E4B15" in names:
                specialization[names.index("FP8_E4B15")] = ["constexpr", fitmatrix._fp8_e4b15(target)]
            results.append(fitmatrix.compile_launch(mod, kernel_name, target, specialization, options))
        json.dump(results, sys.stdout)
        return
    for block_m, block_n, head_dim, preset, geometry, k1 in json.load(sys.stdin):
        assert fitmatrix.GEOMETRY[geometry].head_dim == head_dim, (geometry, head_dim)
        tiles = mod.TQMQTiles(block_m, 1, block_n, mod.tq_mq_score_precision(fitmatrix.limits_for(mod, target)))
        cfg = fitmatrix.Config(target.name, preset, "bf16", 16, k1, geometry)
        results.append(fitmatrix.compile_kernel(mod, "_tq_mq_verify_fwd", target,
                                                fitmatrix.probe_args(mod, tiles, cfg), tiles.num_warps,
                                                tiles.num_stages))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
