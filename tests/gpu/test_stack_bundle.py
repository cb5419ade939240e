"""The stack bundle's pure parts on CPU, without network: synthetic wheels through slimming, the xz streams, the
split, the manifest and the host's assembly (stack_parts.py and stack.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from stack_bundle import LINES, V032_DEPS, V033_DEPS, V033_ONLY, build, dropped, installed_name, resolve
from stack_parts import StackError, assemble, check

HERE = Path(__file__).resolve().parent
STACK_SH = HERE / "stack.sh"

# Each stack's versions as its synthetic wheels carry them: torch, triton, NCCL, vLLM, torch's versioned protoc.
VERSIONS = {
    "v0.33": ("2.14.0", "3.8.0", "2.30.7", "0.33.0", "3.21.12.0"),
    "v0.32": ("2.13.0", "3.7.1", "2.29.7", "0.32.0", "3.13.0.0"),
}


def wheel(tmp: Path, name: str, version: str, files: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    path = tmp / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in {**files, f"{name}-{version}.dist-info/METADATA":
                             f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()}.items():
            info = zipfile.ZipInfo(member, date_time=(2026, 1, 2, 3, 4, 5))
            info.external_attr = ((modes or {}).get(member, 0o644)) << 16
            zf.writestr(info, data)
    return path


def noise(n: int, seed: int) -> bytes:
    """Bytes xz cannot shrink much, so that a small bundle still takes several parts."""
    import random

    return random.Random(seed).randbytes(n)


@pytest.fixture(params=sorted(VERSIONS))
def stack(request) -> str:
    """Every stack with a recipe goes through the same build, split, check and assembly."""
    return request.param


@pytest.fixture
def wheels(tmp_path, stack):
    torch, triton, nccl, vllm, protoc = VERSIONS[stack]
    src = tmp_path / "wheels"
    src.mkdir()
    torch_init = f"__version__ = '{torch}+cu130'\n\nclass cuda:\n    @staticmethod\n    def is_available():\n" \
                 "        return False\n"
    return {
        "torch": [wheel(src, "torch", torch, {
            "torch/__init__.py": torch_init.encode(), "torch/lib/libtorch_cuda.so": noise(70_000, 1),
            "torch/include/ATen/ATen.h": b"// header\n", "torch/lib/libfoo.a": b"static",
            "torch/bin/protoc": b"protoc", f"torch/bin/protoc-{protoc}": b"protoc"})],
        "triton": [wheel(src, "triton", triton, {
            "triton/__init__.py": f"__version__ = '{triton}'\n".encode(),
            "triton/backends/nvidia/bin/ptxas": b"#!/bin/sh\n",
            "triton/backends/nvidia/bin/ptxas-blackwell": b"#!/bin/sh\n"},
            modes={"triton/backends/nvidia/bin/ptxas": 0o755})],
        "nvidia": [wheel(src, "nvidia_nccl_cu13", nccl, {
            "nvidia/nccl/lib/libnccl.so.2": noise(50_000, 2), "nvidia/nccl/include/nccl.h": b"// h\n"})],
        "vllm": [wheel(src, "vllm", vllm, {
            "vllm/__init__.py": b"", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": noise(20_000, 3), "vllm/vllm-rs": b"rust",
            "vllm/third_party/deep_gemm/x.py": b"", "vllm/third_party/fmha_sm100/api.py": b""})],
        "deps": [wheel(src, "tiny", "1.0", {
            "tiny.py": b"X = 1\n", "tiny-1.0.data/purelib/tiny_extra.py": b"Y = 2\n",
            "tiny-1.0.data/scripts/tiny": b"#!python\n"})],
    }


@pytest.fixture
def bundle(tmp_path, wheels, stack):
    out = tmp_path / "out" / stack
    work = tmp_path / "work"
    work.mkdir()
    manifest = build(stack, out, (), work, level=1, part_bytes=40_000, wheels=wheels,
                     python=f"{sys.version_info.major}.{sys.version_info.minor}")
    return out, manifest


def staged(out: Path, dest: Path, skip: str | None = None) -> Path:
    """What stack.sh stage makes of out's part folders: every file in one folder."""
    dest.mkdir(parents=True)
    for folder in sorted(out.iterdir()):
        for f in folder.iterdir():
            if f.name != skip:
                (dest / f.name).write_bytes(f.read_bytes())
    return dest


def test_slimming_rules():
    assert dropped("torch/include/ATen/ATen.h", ("torch/include/",))
    assert dropped("torch/lib/libcpuinfo.a")
    assert dropped("nvidia/nccl/include/nccl.h")
    assert dropped("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")  # bundle.py's own slimming still applies
    assert dropped("vllm/vllm-rs", ("vllm/vllm-rs",))
    assert not dropped("torch/lib/libtorch_cuda.so", ("torch/include/",))
    assert not dropped("nvidia/nccl/lib/libnccl.so.2")
    assert installed_name("a-1.data/platlib/a/b.so") == "a/b.so"
    assert installed_name("a-1.data/scripts/a") is None
    assert installed_name("a/__init__.py") == "a/__init__.py"


def test_v033_ships_nccl():
    line = LINES["v0.33"]
    assert line.torch == "torch==2.14.0" and line.triton.startswith("triton==3.8.")
    assert line.nvidia == ("nvidia-nccl-cu13==2.30.7",)


def test_v032_ships_torch_213_its_triton_and_nccl():
    """torch 2.13.0 pins triton 3.7.1 and NCCL 2.29.7 (8 symbols beyond the host's 2.28.9); its cuDNN, cuBLAS and
    cuSPARSELt pins travel only when asked."""
    line = LINES["v0.32"]
    assert (line.torch, line.triton) == ("torch==2.13.0", "triton==3.7.1")
    assert line.nvidia == ("nvidia-nccl-cu13==2.29.7",)
    assert line.optional == {"cudnn": "nvidia-cudnn-cu13==9.20.0.48", "cublas": "nvidia-cublas==13.1.1.3",
                             "cusparselt": "nvidia-cusparselt-cu13==0.8.1"}
    assert "nvidia-nccl-cu13" in line.why and line.deps is V032_DEPS


def pins(deps: tuple[str, ...]) -> dict[str, str]:
    return {d.split("==")[0].lower().replace("_", "-"): d.split("==")[1] for d in deps}


@pytest.mark.parametrize("stack", sorted(LINES))
def test_deps_pin_once_and_leave_torch_to_its_components(stack):
    """Exact pins, one a package; torch, triton, the nvidia/cuda wheels and numpy never among them; the
    torchvision built for the stack's torch, so that the host's (built for 2.11) is never imported."""
    deps = LINES[stack].deps
    assert all(d.count("==") == 1 for d in deps)
    names = [d.split("==")[0].lower().replace("_", "-") for d in deps]
    assert len(names) == len(set(names))
    assert not [n for n in names if n in ("torch", "numpy") or n.startswith(("triton", "nvidia", "cuda"))]
    torchvision = {"torch==2.14.0": "0.29.0", "torch==2.13.0": "0.28.0"}[LINES[stack].torch]
    assert pins(deps)["torchvision"] == torchvision


def test_v032_deps_are_v033s_where_vllm_032_allows():
    """One snapshot for both stacks: V033_DEPS less what 0.32 cannot take or does not need."""
    assert set(V033_ONLY) <= set(V033_DEPS)
    new, old = pins(V032_DEPS), pins(V033_DEPS)
    assert {n: v for n, v in new.items() if old.get(n) != v} == {"transformers": "5.19.0", "torchvision": "0.28.0"}
    assert set(old) - set(new) == {"orjson"}
    major, minor = map(int, new["transformers"].split(".")[:2])
    assert (5, 16) <= (major, minor) < (5, 20)  # vLLM 0.32.0: transformers>=5.16.1,<5.20.0


def test_a_line_resolves_to_the_stack_of_its_release():
    """`current` (the top-level series, pinned to 0.33.0) and `v0.33` name one stack; lines/v0.32 is its own;
    v0.20 runs on the host's own stack (host.sh), so it has no recipe."""
    stack, series = resolve("current")
    assert stack == "v0.33" and series.pin.version == "0.33.0"
    assert resolve("v0.33")[0] == "v0.33" and resolve("v0.33")[1].names == series.names
    stack, series = resolve("v0.32")
    assert stack == "v0.32" and series.pin.version == "0.32.0"
    assert series.pin.wheel.filename == "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with pytest.raises(SystemExit, match="line v0.20 .* has no stack recipe"):
        resolve("v0.20")
    with pytest.raises(SystemExit, match="no release line 'v0.99'"):
        resolve("v0.99")


def test_parts_manifest_and_assembly_round_trip(tmp_path, bundle, stack):
    out, manifest = bundle
    folders = sorted(p.name for p in out.iterdir())
    assert len(folders) >= 3 and folders == [f"p{i:02d}" for i in range(1, len(folders) + 1)]
    for folder in folders:
        assert json.loads((out / folder / "manifest.json").read_text()) == manifest
    assert all(p["bytes"] <= 40_000 for p in manifest["parts"])
    assert [c["name"] for c in manifest["components"]] == ["torch", "triton", "nvidia", "vllm", "deps"]
    assert sum(c["xz_bytes"] for c in manifest["components"]) == manifest["archive_bytes"]
    assert manifest["line"] == stack and not manifest["cudnn_travels"]

    parts = staged(out, tmp_path / "parts")
    assert check(parts) == manifest
    prefix = tmp_path / "prefix"
    assemble(parts, prefix)
    site = prefix / "site"
    assert (site / "torch/lib/libtorch_cuda.so").read_bytes() == zipfile.ZipFile(
        bundle_wheel(tmp_path, "torch")).read("torch/lib/libtorch_cuda.so")
    assert (site / "nvidia/nccl/lib/libnccl.so.2").exists()
    assert (site / "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so").exists()
    assert (site / "tiny_extra.py").exists() and (site / "tiny.py").exists()
    assert os.access(site / "triton/backends/nvidia/bin/ptxas", os.X_OK)
    assert (site / "vllm" / "__init__.py").exists() and (site / f"vllm-{VERSIONS[stack][3]}.dist-info").is_dir()
    for gone in ("torch/include", "torch/lib/libfoo.a", "torch/bin", "nvidia/nccl/include",
                 "triton/backends/nvidia/bin/ptxas-blackwell", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
                 "vllm/vllm-rs", "vllm/third_party/deep_gemm", "vllm/third_party/fmha_sm100", "bin", "tiny"):
        assert not (site / gone).exists(), gone
    assert (prefix / ".complete").read_text().startswith(f"stack {stack}:")


def bundle_wheel(tmp_path: Path, name: str) -> Path:
    return next((tmp_path / "wheels").glob(f"{name}-*.whl"))


def test_missing_part_refused(tmp_path, bundle):
    out, manifest = bundle
    lost = manifest["parts"][1]
    parts = staged(out, tmp_path / "parts", skip=lost["name"])
    with pytest.raises(StackError, match=r"1 of \d+ parts missing .*: stage p02$"):
        check(parts)


def test_corrupt_part_refused(tmp_path, bundle):
    out, manifest = bundle
    parts = staged(out, tmp_path / "parts")
    bad = parts / manifest["parts"][-1]["name"]
    data = bytearray(bad.read_bytes())
    data[10] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(StackError, match=r"part .* is corrupt .*: stage p\d\d again$"):
        check(parts)
    assert not (tmp_path / "prefix").exists()


def test_cli_says_one_line(tmp_path, bundle):
    out, manifest = bundle
    parts = staged(out, tmp_path / "parts", skip=manifest["parts"][0]["name"])
    proc = subprocess.run([sys.executable, str(HERE / "stack_parts.py"), "setup", str(parts), str(tmp_path / "p")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("stack: 1 of ")


def bash(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "VP_HOME": str(home), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(STACK_SH), *args], capture_output=True, text=True, env=env)


def test_stack_sh_stage_setup_run(tmp_path, bundle, stack):
    out, manifest = bundle
    torch, triton = VERSIONS[stack][:2]
    home = tmp_path / "home"
    folders = sorted(str(p) for p in out.iterdir())
    proc = bash("setup", stack, home=home)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert bash("stage", *folders[:-1], home=home).returncode == 0
    proc = bash("setup", stack, home=home)
    assert proc.returncode == 2 and "1 of" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert bash("stage", folders[-1], home=home).returncode == 0
    proc = bash("setup", stack, home=home)
    assert proc.returncode == 0, proc.stderr
    assert (home / f"stack/{stack}/prefix/site/torch/__init__.py").exists()
    proc = bash("run", stack, sys.executable, "-c", "import tiny, torch; print('tiny', tiny.X, torch.__file__)",
                home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{torch}+cu130 {triton} False"
    assert lines[-1].startswith("tiny 1 ") and lines[-1].endswith(f"stack/{stack}/prefix/site/torch/__init__.py")
    proc = bash("env", stack, home=home)
    assert proc.returncode == 0 and f"PYTHONPATH={home}/stack/{stack}/prefix/site" in proc.stdout, proc.stderr
    # `current` is the top-level series, pinned to 0.33: the same stack as v0.33, never v0.32's.
    proc = bash("env", "current", home=home)
    if stack == "v0.33":
        assert proc.returncode == 0 and f"PYTHONPATH={home}/stack/v0.33/prefix/site" in proc.stdout, proc.stderr
    else:
        assert proc.returncode == 2 and "no prefix for current" in proc.stderr and proc.stdout == "", proc.stderr
    proc = bash("check", "v0.99", home=home)
    assert proc.returncode == 2 and "no release line v0.99" in proc.stderr and proc.stderr.count("\n") == 1, \
        proc.stderr
