"""The doctor's probe: runs in the interpreter of the vLLM under examination (``--python``), so it sees that
interpreter's torch, Triton and GPUs, and needs nothing beyond them and the standard library (never
``vllm_patch``'s dependencies, never ``import vllm``).

``vllm-patch doctor`` runs this package by its path (``BOOT``) and writes a request (JSON) on its standard
input; the probe answers with one JSON event a line on its standard output (anything else the kernels or
libraries print goes to standard error): ``progress``, ``runtime``, ``gpus``, ``routes``, ``check``,
``timing``, ``error`` and a final ``done``.

On a GPU most of the time goes into compiling the kernels (the route's probe launches at each K+1, the
check's and the timing's shapes). The presets' compiles overlap: each preset's route, check and warm-up
launches run in a worker of their own (``parallel``: ``threads``, the default; ``processes``, which share
Triton's on-disk cache with this one; or ``serial``), then the same steps run again here, every kernel
compiled by then, and the routes are timed one preset after the other. With a cold Triton cache the
whole probe (four presets, Qwen3.6-27B's geometry) took 104 s serially on an H100 host and 48 s with the
presets overlapped on an H200 host (16 cores each; threads and processes alike); with a warm cache, 7 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

KERNEL = "vllm/v1/attention/ops/triton_turboquant_verify.py"
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
# How to run this package in an interpreter: by its path, under a private name. The working directory
# ('' on sys.path under -c) is dropped: a module there named like one of torch's must not shadow it.
BOOT = (
    "import importlib.util, sys\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
    "spec = importlib.util.spec_from_file_location('_vllm_patch_doctor_probe', sys.argv[1],"
    " submodule_search_locations=[sys.argv[2]])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "sys.modules[spec.name] = module\n"
    "spec.loader.exec_module(module)\n"
    "module.main()\n"
)


def command(python: str) -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    return [python, "-c", BOOT, os.path.join(here, "__init__.py"), here]


class Events:
    def __init__(self, stream) -> None:
        self.stream = stream
        self.start = time.monotonic()

    def __call__(self, event: str, **data) -> None:
        if self.stream is None:
            return
        self.stream.write(json.dumps({"event": event, **data}, default=str) + "\n")
        self.stream.flush()

    def progress(self, text: str) -> None:
        self("progress", text=text, elapsed=round(time.monotonic() - self.start, 1))


def _public(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def _limits(limits) -> dict | None:
    if limits is None:
        return None
    return {"max_shared": limits.max_shared, "capability": limits.capability, "hip": limits.hip}


class Probe:
    """The request's steps on the loaded kernel files."""

    def __init__(self, request: dict, emit: Events, kernel, decode) -> None:
        import torch

        self.request, self.emit, self.kernel, self.decode = request, emit, kernel, decode
        self.shapes = [tuple(s) for s in request["shapes"]]
        self.k1s = request["k1s"]
        self.check_k1 = int(request["check_k1"])
        self.heads = tuple(request["check_heads"])
        self.block_size = int(request.get("block_size") or 16)
        self.dtype = getattr(torch, request.get("dtype") or "bfloat16")

    def target(self, index):
        """(limits, the probe launch's arguments, FlyDSL) on device `index` ("cpu": the interpreter)."""
        import torch

        from . import gpu
        if index == "cpu":
            return None, None, False
        device = next(d for d in self.request["_devices"] if d["index"] == index)
        probe = {"block_size": self.block_size, "query_dtype": self.dtype, "device": torch.device("cuda", index)}
        return self.kernel.tq_mq_device_limits(index), probe, gpu.flydsl_route(device)

    def prepare(self, index, preset: str, check: bool) -> tuple[list[dict], dict | None]:
        """One preset on one device: its route rows; with `check`, the kernel checked (and, where the
        timing follows, warmed up in the timing's other shapes)."""
        import torch

        from . import check as checks
        from . import routes
        limits, probe, flydsl = self.target(index)
        rows = routes.route_table(self.kernel, limits, self.shapes, [preset], self.k1s, probe, flydsl)
        if not check:
            return rows, None
        hq, hk, d = self.heads
        row = next((r for r in rows if (r["group"], r["head_dim"], r["k1"]) == (hq // hk, d, self.check_k1)), None)
        tiles = row.get("_tiles") if row else None
        device = torch.device("cpu") if index == "cpu" else torch.device("cuda", index)
        try:
            result = checks.check_preset(self.kernel, self.decode, preset, self.heads, self.check_k1, tiles, device,
                                         self.block_size)
        except Exception as exc:  # noqa: BLE001 - a kernel that fails to run fails the check
            return rows, {"preset": preset, "k1": self.check_k1, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if self.timed(index, tiles, result):
            # A failure here shows again, and is reported, when the timing runs.
            with contextlib.suppress(Exception):
                checks.warm_up(self.kernel, self.decode, preset, self.heads, self.check_k1, tiles, device,
                               self.block_size)
        result["_tiles"] = tiles
        return rows, result

    def timed(self, index, tiles, result: dict) -> bool:
        return index != "cpu" and tiles is not None and bool(self.request.get("timing")) and bool(result.get("ok"))

    def overlap(self, index, presets: list[str], check: bool) -> None:
        """The presets' compiles at once, in workers; their results are taken again afterwards."""
        mode = self.request.get("parallel", "threads")
        if index == "cpu" or len(presets) < 2 or mode == "serial":
            return
        self.emit.progress(f"compiling the kernels for {len(presets)} presets at once ({mode})")
        if mode == "threads":
            def prepare(preset: str) -> None:
                with contextlib.suppress(Exception):  # the pass that follows reports what fails
                    self.prepare(index, preset, check)

            with ThreadPoolExecutor(len(presets)) as pool:
                list(pool.map(prepare, presets))
            return
        procs = []
        for preset in presets:
            sub = {**self.request, "presets": [preset], "device": index, "_worker": True, "_check": check}
            proc = subprocess.Popen(command(sys.executable), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, text=True)
            proc.stdin.write(json.dumps(sub, default=str))
            proc.stdin.close()
            procs.append(proc)
        for proc in procs:
            proc.wait()

    def run_device(self, index, check: bool) -> None:
        from . import check as checks
        presets = self.request["presets"]
        where = "the CPU" if index == "cpu" else f"cuda:{index}"
        self.overlap(index, presets, check)
        rows, results = [], []
        for preset in presets:
            self.emit.progress(f"planning the route on {where}" + (f", checking {preset}" if check else f": {preset}"))
            preset_rows, result = self.prepare(index, preset, check)
            rows += preset_rows
            results.append(result)
        limits = self.target(index)[0]
        self.emit("routes", device=index, limits=_limits(limits), rows=[_public(r) for r in rows])
        for result in results:
            if result is not None:
                self.emit("check", device=index, heads=list(self.heads), result=_public(result))
        for preset, result in zip(presets, results, strict=True):
            if result is None or not self.timed(index, result.get("_tiles"), result):
                continue
            try:
                cells = checks.time_preset(self.kernel, self.decode, preset, self.heads, self.check_k1,
                                           result["_tiles"], self.device(index), self.block_size, self.emit.progress)
            except Exception as exc:  # noqa: BLE001 - say so; the check itself stands
                self.emit("timing", device=index, preset=preset, k1=self.check_k1, cells=[],
                          error=f"{type(exc).__name__}: {exc}")
                continue
            self.emit("timing", device=index, preset=preset, k1=self.check_k1, cells=cells)

    @staticmethod
    def device(index):
        import torch

        return torch.device("cpu") if index == "cpu" else torch.device("cuda", index)


def _load(request: dict):
    from . import tree
    root = request["root"]
    return tree.load_module(root, request.get("kernel", KERNEL)), tree.load_module(root, request.get("decode", DECODE))


def run(request: dict, emit: Events) -> None:
    import torch

    from . import gpu
    if request.get("_worker"):  # a worker of `Probe.overlap`: compiles, nothing to say
        kernel, decode = _load(request)
        request["_devices"] = gpu.devices(request["device"])
        Probe(request, emit, kernel, decode).prepare(request["device"], request["presets"][0], request["_check"])
        return
    emit("runtime", runtime=gpu.runtime())
    interpret = bool(request.get("interpret"))
    assumed = request.get("limits")
    devices = gpu.devices(request.get("device")) if torch.cuda.is_available() else []
    no_gpu = None
    if not torch.cuda.is_available():
        no_gpu = "torch.cuda.is_available() is False"
    elif not devices:
        no_gpu = f"device {request.get('device')} is not one of the {torch.cuda.device_count()} visible"
    emit("gpus", gpus=devices, no_gpu=no_gpu)
    if not request.get("routes") or (not devices and not interpret and not assumed):
        return
    emit.progress("loading the installed kernels")
    try:
        kernel, decode = _load(request)
    except Exception as exc:  # noqa: BLE001 - the installed files are what is under examination
        emit("error", stage="load", message=f"{type(exc).__name__}: {exc}")
        return
    request["_devices"] = devices
    probe = Probe(request, emit, kernel, decode)
    if assumed:
        from . import routes
        limits = kernel.TQMQLimits(int(assumed["max_shared"]), int(assumed["capability"]), bool(assumed.get("hip")))
        rows = routes.route_table(kernel, limits, probe.shapes, request["presets"], probe.k1s)
        emit("routes", device="assumed", limits=_limits(limits), rows=[_public(r) for r in rows])
        return
    indices = ["cpu"] if interpret else [d["index"] for d in devices]
    for n, index in enumerate(indices):
        probe.run_device(index, check=bool(request.get("check")) and n == 0)


def main() -> None:
    events = Events(os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)  # whatever else is printed goes to standard error
    sys.stdout = sys.stderr
    try:
        run(json.loads(sys.stdin.read() or "{}"), events)
    except Exception as exc:  # noqa: BLE001 - one event, the tool says it
        events("error", stage="probe", message=f"{type(exc).__name__}: {exc}", detail=traceback.format_exc(limit=-3))
    events("done")
