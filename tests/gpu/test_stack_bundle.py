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
from stack_bundle import LINES, build, dropped, installed_name, resolve
from stack_parts import StackError, assemble, check

HERE = Path(__file__).resolve().parent
STACK_SH = HERE / "stack.sh"


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


@pytest.fixture
def wheels(tmp_path):
    src = tmp_path / "wheels"
    src.mkdir()
    torch_init = b"__version__ = '2.14.0+cu130'\n\nclass cuda:\n    @staticmethod\n    def is_available():\n" \
                 b"        return False\n"
    return {
        "torch": [wheel(src, "torch", "2.14.0", {
            "torch/__init__.py": torch_init, "torch/lib/libtorch_cuda.so": noise(70_000, 1),
            "torch/include/ATen/ATen.h": b"// header\n", "torch/lib/libfoo.a": b"static",
            "torch/bin/protoc": b"protoc"})],
        "triton": [wheel(src, "triton", "3.8.0", {
            "triton/__init__.py": b"__version__ = '3.8.0'\n", "triton/backends/nvidia/bin/ptxas": b"#!/bin/sh\n",
            "triton/backends/nvidia/bin/ptxas-blackwell": b"#!/bin/sh\n"},
            modes={"triton/backends/nvidia/bin/ptxas": 0o755})],
        "nvidia": [wheel(src, "nvidia_nccl_cu13", "2.30.7", {
            "nvidia/nccl/lib/libnccl.so.2": noise(50_000, 2), "nvidia/nccl/include/nccl.h": b"// h\n"})],
        "vllm": [wheel(src, "vllm", "0.33.0", {
            "vllm/__init__.py": b"", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": noise(20_000, 3), "vllm/vllm-rs": b"rust",
            "vllm/third_party/deep_gemm/x.py": b"", "vllm/third_party/fmha_sm100/api.py": b""})],
        "deps": [wheel(src, "tiny", "1.0", {
            "tiny.py": b"X = 1\n", "tiny-1.0.data/purelib/tiny_extra.py": b"Y = 2\n",
            "tiny-1.0.data/scripts/tiny": b"#!python\n"})],
    }


@pytest.fixture
def bundle(tmp_path, wheels):
    out = tmp_path / "out" / "v0.33"
    work = tmp_path / "work"
    work.mkdir()
    manifest = build("v0.33", out, (), work, level=1, part_bytes=40_000, wheels=wheels,
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


def test_v033_ships_nccl_and_no_torch_pins_twice():
    line = LINES["v0.33"]
    assert line.torch == "torch==2.14.0" and line.triton.startswith("triton==3.8.")
    assert line.nvidia == ("nvidia-nccl-cu13==2.30.7",)
    names = [d.split("==")[0].lower() for d in line.deps]
    assert len(names) == len(set(names))
    assert not [n for n in names if n.startswith(("torch==", "triton", "nvidia", "cuda", "numpy"))]


def test_a_line_resolves_to_the_stack_of_its_release():
    """`current` (the top-level series, pinned to 0.33.0) and `v0.33` name one stack; v0.20 runs on the host's
    own stack (host.sh), so it has no recipe."""
    stack, series = resolve("current")
    assert stack == "v0.33" and series.pin.version == "0.33.0"
    assert resolve("v0.33")[0] == "v0.33" and resolve("v0.33")[1].names == series.names
    with pytest.raises(SystemExit, match="line v0.20 .* has no stack recipe"):
        resolve("v0.20")
    with pytest.raises(SystemExit, match="no release line 'v0.99'"):
        resolve("v0.99")


def test_parts_manifest_and_assembly_round_trip(tmp_path, bundle):
    out, manifest = bundle
    folders = sorted(p.name for p in out.iterdir())
    assert len(folders) >= 3 and folders == [f"p{i:02d}" for i in range(1, len(folders) + 1)]
    for folder in folders:
        assert json.loads((out / folder / "manifest.json").read_text()) == manifest
    assert all(p["bytes"] <= 40_000 for p in manifest["parts"])
    assert [c["name"] for c in manifest["components"]] == ["torch", "triton", "nvidia", "vllm", "deps"]
    assert sum(c["xz_bytes"] for c in manifest["components"]) == manifest["archive_bytes"]
    assert manifest["line"] == "v0.33" and not manifest["cudnn_travels"]

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
    for gone in ("torch/include", "torch/lib/libfoo.a", "torch/bin/protoc", "nvidia/nccl/include",
                 "triton/backends/nvidia/bin/ptxas-blackwell", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
                 "vllm/vllm-rs", "vllm/third_party/deep_gemm", "vllm/third_party/fmha_sm100", "bin", "tiny"):
        assert not (site / gone).exists(), gone
    assert (prefix / ".complete").read_text().startswith("stack v0.33:")


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


def test_stack_sh_stage_setup_run(tmp_path, bundle):
    out, manifest = bundle
    home = tmp_path / "home"
    folders = sorted(str(p) for p in out.iterdir())
    proc = bash("setup", "v0.33", home=home)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert bash("stage", *folders[:-1], home=home).returncode == 0
    proc = bash("setup", "v0.33", home=home)
    assert proc.returncode == 2 and "1 of" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert bash("stage", folders[-1], home=home).returncode == 0
    proc = bash("setup", "v0.33", home=home)
    assert proc.returncode == 0, proc.stderr
    assert (home / "stack/v0.33/prefix/site/torch/__init__.py").exists()
    proc = bash("run", "v0.33", sys.executable, "-c", "import tiny, torch; print('tiny', tiny.X, torch.__file__)",
                home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "2.14.0+cu130 3.8.0 False"
    assert lines[-1].startswith("tiny 1 ") and lines[-1].endswith("stack/v0.33/prefix/site/torch/__init__.py")
    # `current` is the top-level series, pinned to 0.33: the same stack.
    proc = bash("env", "current", home=home)
    assert proc.returncode == 0 and f"PYTHONPATH={home}/stack/v0.33/prefix/site" in proc.stdout, proc.stderr
    proc = bash("check", "v0.99", home=home)
    assert proc.returncode == 2 and "no release line v0.99" in proc.stderr and proc.stderr.count("\n") == 1, \
        proc.stderr
