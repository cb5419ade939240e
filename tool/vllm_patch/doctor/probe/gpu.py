"""What the target interpreter runs on: Python, torch, Triton and driver versions, and each visible GPU's
name, capability (or gfx arch), shared memory per block (the opt-in maximum, as Triton checks it at launch)
and SM count."""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - not installed, or no metadata
        return None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version: NVML (vLLM depends on nvidia-ml-py), /proc, else nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no NVML: the next source
        pass
    try:
        found = re.search(r"Kernel Module\s+(\S+)", Path("/proc/driver/nvidia/version").read_text())
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.split()
        return out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def runtime() -> dict:
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "hip": torch.version.hip, "triton": _version("triton"), "driver": None}
    if torch.version.hip is None and torch.cuda.is_available():
        facts["driver"] = _nvidia_driver()
    elif torch.version.hip is not None:
        try:
            facts["driver"] = Path("/sys/module/amdgpu/version").read_text().strip() or None
        except OSError:
            pass
    return facts


def max_shared(index: int) -> int | None:
    """Shared memory per block, the opt-in maximum (what Triton's launch checks against)."""
    try:
        import triton

        return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # noqa: BLE001 - fall back on torch's own property
        import torch

        value = getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", None)
        return int(value) if value else None


def devices(only: int | None = None) -> list[dict]:
    """Each visible GPU (or only device `only`)."""
    import torch

    hip = torch.version.hip is not None
    out = []
    for index in range(torch.cuda.device_count()):
        if only is not None and index != only:
            continue
        props = torch.cuda.get_device_properties(index)
        arch = getattr(props, "gcnArchName", None) if hip else None
        out.append({"index": index, "name": props.name,
                    "capability": None if hip else f"{props.major}.{props.minor}",
                    "arch": arch.split(":")[0] if arch else None,
                    "max_shared": max_shared(index), "sm_count": props.multi_processor_count,
                    "memory_gib": round(props.total_memory / 2**30, 1)})
    return out


def flydsl_route(device: dict) -> bool:
    """Whether vLLM takes its FlyDSL path there (gfx950 with FlyDSL installed), where the multi-query
    kernel is not used."""
    import importlib.util

    return (device.get("arch") or "").startswith("gfx950") and importlib.util.find_spec("flydsl") is not None
