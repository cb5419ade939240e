"""The stack bundle's pure parts on CPU, without network: synthetic wheels through slimming, the xz streams, the
split, the manifest and the host's assembly (stack_parts.py and stack.sh); and every recipe against its release's
Requires-Dist (gpu/requires/, copied from the wheels' METADATA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from stack_bundle import (
    HOST_PACKAGES,
    LINES,
    V025_DEPS,
    V025_LEAVES,
    V027_DEPS,
    V032_DEPS,
    V032_ONLY,
    V033_DEPS,
    V033_ONLY,
    build,
    dropped,
    installed_name,
    resolve,
)
from stack_parts import StackError, assemble, check

HERE = Path(__file__).resolve().parents[2] / "gpu"  # the stack bundle's scripts
STACK_SH = HERE / "stack.sh"
REQUIRES = HERE / "requires"

# Each stack's versions as its synthetic wheels carry them: torch, triton, NCCL, vLLM, torch's versioned protoc
# (None: the host's torch, nothing of it travels).
VERSIONS = {
    "v0.33": ("2.14.0", "3.8.0", "2.30.7", "0.33.0", "3.21.12.0"),
    "v0.32": ("2.13.0", "3.7.1", "2.29.7", "0.32.0", "3.13.0.0"),
    "v0.27": ("2.13.0", "3.7.1", "2.29.7", "0.27.1", "3.13.0.0"),
    "v0.25": (None, None, None, "0.25.1", None),
}
# The GPU host's torch and triton as a fake host site dir gives them to a host-torch stack.
FAKE_HOST = ("2.11.0", "3.6.0")


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


def torch_init(version: str) -> bytes:
    return (f"__version__ = '{version}+cu130'\n\nclass cuda:\n    @staticmethod\n    def is_available():\n"
            "        return False\n").encode()


@pytest.fixture
def wheels(tmp_path, stack):
    torch, triton, nccl, vllm, protoc = VERSIONS[stack]
    src = tmp_path / "wheels"
    src.mkdir()
    host = {
        "vllm": [wheel(src, "vllm", vllm, {
            "vllm/__init__.py": b"", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": noise(20_000, 3), "vllm/vllm-rs": b"rust",
            "vllm/third_party/deep_gemm/x.py": b"", "vllm/third_party/fmha_sm100/api.py": b""})],
        "deps": [wheel(src, "tiny", "1.0", {
            "tiny.py": b"X = 1\n", "tiny-1.0.data/purelib/tiny_extra.py": noise(60_000, 4),
            "tiny-1.0.data/scripts/tiny": b"#!python\n"})],
    }
    if LINES[stack].host_torch:
        return host
    return {
        "torch": [wheel(src, "torch", torch, {
            "torch/__init__.py": torch_init(torch), "torch/lib/libtorch_cuda.so": noise(70_000, 1),
            "torch/include/ATen/ATen.h": b"// header\n", "torch/lib/libfoo.a": b"static",
            "torch/bin/protoc": b"protoc", f"torch/bin/protoc-{protoc}": b"protoc"})],
        "triton": [wheel(src, "triton", triton, {
            "triton/__init__.py": f"__version__ = '{triton}'\n".encode(),
            "triton/backends/nvidia/bin/ptxas": b"#!/bin/sh\n",
            "triton/backends/nvidia/bin/ptxas-blackwell": b"#!/bin/sh\n"},
            modes={"triton/backends/nvidia/bin/ptxas": 0o755})],
        "nvidia": [wheel(src, "nvidia_nccl_cu13", nccl, {
            "nvidia/nccl/lib/libnccl.so.2": noise(50_000, 2), "nvidia/nccl/include/nccl.h": b"// h\n"})],
        **host,
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
    if LINES[stack].host_torch:  # the host's torchvision, built for its torch
        assert "torchvision" not in names and LINES[stack].nvidia == () and LINES[stack].optional == {}
        return
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


def test_v027_is_v032s_stack_with_its_own_deps():
    """vLLM 0.27.1 pins torch 2.13.0 as 0.32.0 does: the same torch, triton, NCCL and optional libraries."""
    v027, v032 = LINES["v0.27"], LINES["v0.32"]
    assert (v027.torch, v027.triton, v027.nvidia, v027.optional) == (v032.torch, v032.triton, v032.nvidia,
                                                                     v032.optional)
    assert v027.deps is V027_DEPS and "nvidia-nccl-cu13" in v027.why


def test_v027_deps_are_v032s_where_vllm_0271_allows():
    """One snapshot: V032_DEPS, but openai-harmony (which 0.27.1 requires and imports) for its fork oss-harmony."""
    assert set(V032_ONLY) <= set(V032_DEPS)
    new, old = pins(V027_DEPS), pins(V032_DEPS)
    assert {n: v for n, v in new.items() if old.get(n) != v} == {"openai-harmony": "0.0.8"}
    assert set(old) - set(new) == {"oss-harmony"}


def test_v025_runs_on_the_host_torch():
    """vLLM 0.25.1 pins the host's torch 2.11.0 and torchvision 0.26.0: nothing of torch travels."""
    line = LINES["v0.25"]
    assert line.host_torch and line.triton is None and line.nvidia == () and line.optional == {}
    assert not any(line.host_torch for name, line in LINES.items() if name != "v0.25")
    assert line.deps is V025_DEPS


def test_v025_deps_are_v027s_less_the_hosts():
    """V027_DEPS less what the host has new enough (its Hugging Face packages, torchvision), with 0.25.1's own pins:
    apache-tvm-ffi 0.1.9, the xgrammar that takes it, diskcache."""
    assert set(V025_LEAVES) <= set(V027_DEPS)
    new, old = pins(V025_DEPS), pins(V027_DEPS)
    assert {n: v for n, v in new.items() if old.get(n) != v} == {
        "apache-tvm-ffi": "0.1.9", "xgrammar": "0.2.3", "diskcache": "5.6.3"}
    left = set(old) - set(new)
    assert left == {"huggingface-hub", "safetensors", "tiktoken", "tokenizers", "torchvision", "transformers"}
    assert left <= set(HOST_PACKAGES)


# The release each stack is pinned to (its gpu/requires/vllm-X.Y.Z.txt).
RELEASES = {"v0.25": "0.25.1", "v0.27": "0.27.1", "v0.32": "0.32.0", "v0.33": "0.33.0"}
# The requirement markers of the host: CPython 3.12 on x86_64 Linux, no extras.
HOST_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
            "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": ""}


def requires(version: str) -> list[Requirement]:
    """vLLM version's Requires-Dist that apply on the host."""
    lines = (REQUIRES / f"vllm-{version}.txt").read_text().splitlines()
    reqs = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(HOST_ENV)]


def contradictions(stack: str, line=None) -> list[str]:
    """Where stack's recipe (or line, in its place) and what it leaves to the host break its release's
    Requires-Dist: a carried package (torch included) at a version the release refuses, or, on the host's torch,
    a host package (HOST_PACKAGES) the release refuses that the stack leaves home."""
    line = line or LINES[stack]
    carried = pins(line.deps)
    if not line.host_torch:
        carried |= pins((line.torch, line.triton))
    found = []
    for req in requires(RELEASES[stack]):
        name = canonicalize_name(req.name)
        version, where = (carried[name], "carried") if name in carried else (
            (HOST_PACKAGES[name], "the host's") if line.host_torch and name in HOST_PACKAGES else (None, None))
        if version is not None and not req.specifier.contains(version, prereleases=True):
            found.append(f"{req}: {where} {version}")
        if name == "torch" and version is None:
            found.append(f"{req}: no torch")
    return found


@pytest.mark.parametrize("stack", sorted(LINES))
def test_recipe_satisfies_its_release_requires(stack):
    """Every package a stack carries, its torch, and (on the host's torch) what it leaves to the host, at versions
    the release's Requires-Dist allows."""
    assert set(RELEASES) == set(LINES)
    assert contradictions(stack) == []


def test_a_recipe_against_its_release_is_caught():
    """The check fails a recipe that contradicts its release: 0.27.1's apache-tvm-ffi pin, 0.32.0's transformers
    bound, 0.25.1's torch (the host's, so a recipe that carried torch 2.13.0 would break it)."""
    from dataclasses import replace

    v027 = replace(LINES["v0.27"], deps=tuple(d.replace("apache-tvm-ffi==0.1.11", "apache-tvm-ffi==0.1.9")
                                              for d in V027_DEPS))
    assert contradictions("v0.27", v027) == ["apache-tvm-ffi==0.1.11: carried 0.1.9"]
    v032 = replace(LINES["v0.32"], deps=V033_DEPS)
    assert [c for c in contradictions("v0.32", v032) if c.startswith("transformers")] == [
        "transformers<5.20.0,>=5.16.1: carried 5.20.2"]
    v025 = replace(LINES["v0.25"], torch="torch==2.13.0", triton="triton==3.7.1")
    assert contradictions("v0.25", v025) == ["torch==2.11.0: carried 2.13.0"]


@pytest.mark.integration
@pytest.mark.parametrize(("stack", "version"), sorted(RELEASES.items()))
def test_requires_are_the_wheels(stack, version):
    """gpu/requires/ holds each pinned wheel's own Requires-Dist (the wheel from the index, checked against
    the line's pinned sha256, downloaded once and cached)."""
    from vllm_patch.infrastructure.downloads import fetch

    _, series = resolve(stack)
    assert series.pin.version == version
    wheel_path = fetch(series.pin.wheel, quiet=True)
    with zipfile.ZipFile(wheel_path) as zf:
        metadata = zf.read(f"vllm-{version}.dist-info/METADATA").decode()
    expected = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    ours = [line for line in (REQUIRES / f"vllm-{version}.txt").read_text().splitlines() if not line.startswith("#")]
    assert ours == expected


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
    for name, version in RELEASES.items():
        try:
            stack, series = resolve(name)
        except SystemExit:  # lines/v0.27 and lines/v0.25 come with their own branches
            continue
        assert stack == name and series.pin.version == version
        assert series.pin.wheel.filename == f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with pytest.raises(SystemExit, match="no release line 'v0.99'"):
        resolve("v0.99")


def test_parts_manifest_and_assembly_round_trip(tmp_path, bundle, stack):
    out, manifest = bundle
    folders = sorted(p.name for p in out.iterdir())
    assert len(folders) >= 3 and folders == [f"p{i:02d}" for i in range(1, len(folders) + 1)]
    for folder in folders:
        assert json.loads((out / folder / "manifest.json").read_text()) == manifest
    assert all(p["bytes"] <= 40_000 for p in manifest["parts"])
    host_torch = LINES[stack].host_torch
    assert [c["name"] for c in manifest["components"]] == (
        ["vllm", "deps"] if host_torch else ["torch", "triton", "nvidia", "vllm", "deps"])
    assert sum(c["xz_bytes"] for c in manifest["components"]) == manifest["archive_bytes"]
    assert manifest["line"] == stack and not manifest["cudnn_travels"] and manifest["host_torch"] is host_torch
    assert manifest["note"].startswith(f"stack {stack}: the host's torch and triton, vllm-" if host_torch
                                       else f"stack {stack}: torch-")

    parts = staged(out, tmp_path / "parts")
    assert check(parts) == manifest
    prefix = tmp_path / "prefix"
    assemble(parts, prefix)
    site = prefix / "site"
    if host_torch:
        assert not [p for p in ("torch", "triton", "nvidia") if (site / p).exists()]
    else:
        assert (site / "torch/lib/libtorch_cuda.so").read_bytes() == zipfile.ZipFile(
            bundle_wheel(tmp_path, "torch")).read("torch/lib/libtorch_cuda.so")
        assert (site / "nvidia/nccl/lib/libnccl.so.2").exists()
        assert os.access(site / "triton/backends/nvidia/bin/ptxas", os.X_OK)
    assert (site / "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so").exists()
    assert (site / "tiny_extra.py").exists() and (site / "tiny.py").exists()
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


def fake_host_site(tmp_path: Path) -> Path:
    """A site dir with the host's torch and triton (FAKE_HOST), for a host-torch stack's PYTHONPATH."""
    site = tmp_path / "host-site"
    (site / "torch").mkdir(parents=True)
    (site / "triton").mkdir()
    (site / "torch/__init__.py").write_bytes(torch_init(FAKE_HOST[0]))
    (site / "triton/__init__.py").write_text(f"__version__ = '{FAKE_HOST[1]}'\n")
    return site


def test_stack_sh_stage_setup_run(tmp_path, bundle, stack, monkeypatch):
    out, manifest = bundle
    host_torch = LINES[stack].host_torch
    torch, triton = FAKE_HOST if host_torch else VERSIONS[stack][:2]
    if host_torch:  # the host's torch comes after the prefix on PYTHONPATH
        monkeypatch.setenv("PYTHONPATH", str(fake_host_site(tmp_path)))
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
    assert (home / f"stack/{stack}/prefix/site/vllm/__init__.py").exists()
    assert (home / f"stack/{stack}/prefix/site/torch/__init__.py").exists() is not host_torch
    proc = bash("run", stack, sys.executable, "-c", "import tiny, torch; print('tiny', tiny.X, torch.__file__)",
                home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{torch}+cu130 {triton} False"
    torch_file = "host-site/torch/__init__.py" if host_torch else f"stack/{stack}/prefix/site/torch/__init__.py"
    assert lines[-1].startswith("tiny 1 ") and lines[-1].endswith(torch_file)
    proc = bash("env", stack, home=home)
    assert proc.returncode == 0 and f"PYTHONPATH={home}/stack/{stack}/prefix/site" in proc.stdout, proc.stderr
    # the line's torch was built with a newer cuDNN than the host's; the host's torch with the host's
    assert ("PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1" in proc.stdout) is not host_torch
    if host_torch:
        assert f"/stack/{stack}/prefix/site/nvidia" not in proc.stdout
    # `current` is the top-level series, pinned to 0.33: the same stack as v0.33, never v0.32's.
    proc = bash("env", "current", home=home)
    if stack == "v0.33":
        assert proc.returncode == 0 and f"PYTHONPATH={home}/stack/v0.33/prefix/site" in proc.stdout, proc.stderr
    else:
        assert proc.returncode == 2 and "no prefix for current" in proc.stderr and proc.stdout == "", proc.stderr
    proc = bash("check", "v0.99", home=home)
    assert proc.returncode == 2 and "no release line v0.99" in proc.stderr and proc.stderr.count("\n") == 1, \
        proc.stderr


def test_reuse_takes_identical_streams_and_compresses_the_rest(tmp_path, wheels, stack):
    """--reuse: a made bundle's xz stream stands for a component only where it decompresses to exactly that
    component's bytes; the archive is then the one compression would have made (xz is deterministic here), and a
    component that changed is compressed anew."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    work = tmp_path / "work"
    work.mkdir()
    first = build(stack, tmp_path / "a", (), work, level=1, part_bytes=40_000, wheels=wheels, python=python)
    assert first["reused"] == {}
    again = build(stack, tmp_path / "b", (), work, level=1, part_bytes=40_000, wheels=wheels, python=python,
                  reuse=tmp_path / "a")
    assert again["reused"] == {c["name"]: stack for c in first["components"]}
    assert again["archive_sha256"] == first["archive_sha256"]
    changed = {**wheels, "vllm": [wheel(tmp_path / "wheels", "vllm", "9.9.9", {"vllm/__init__.py": b"new\n"})]}
    third = build(stack, tmp_path / "c", (), work, level=1, part_bytes=40_000, wheels=changed, python=python,
                  reuse=tmp_path / "a")
    assert set(third["reused"]) == {c["name"] for c in first["components"]} - {"vllm"}
    parts = staged(tmp_path / "c", tmp_path / "parts")
    assert check(parts) == third
    assemble(parts, tmp_path / "prefix")
    assert (tmp_path / "prefix/site/vllm/__init__.py").read_bytes() == b"new\n"
    assert (tmp_path / "prefix/site/tiny.py").exists()
    # another xz level never reuses
    other = build(stack, tmp_path / "d", (), work, level=2, part_bytes=40_000, wheels=wheels, python=python,
                  reuse=tmp_path / "a")
    assert other["reused"] == {}


def test_scenarios_refuses_an_unknown_runner_before_touching_anything(tmp_path):
    env = {**os.environ, "VP_HOME": str(tmp_path), "PYTHON": sys.executable, "VP_RUNNER": "v3"}
    proc = subprocess.run(["bash", str(STACK_SH), "scenarios", "v0.33"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "VP_RUNNER is v1 or v2" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("without", "message"), [("5", "VP_WITHOUT is a patch number such as 0005"),
                                                  ("0099", "VP_WITHOUT: no patch 0099 in the series of v0.33")])
def test_bench_refuses_a_bad_patch_to_leave_out_before_touching_anything(tmp_path, without, message):
    env = {**os.environ, "VP_HOME": str(tmp_path), "PYTHON": sys.executable, "VP_WITHOUT": without}
    proc = subprocess.run(["bash", str(STACK_SH), "bench", "v0.33", "--group", "drafter"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []
