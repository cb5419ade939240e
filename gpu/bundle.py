"""Make the offline bundle for a GPU host without network, here (where PyPI is reachable).

The bundle holds a release line's pinned vLLM wheel (line v0.20, vLLM 0.20.0: the host's
torch 2.11 and triton 3.6 are its stack) as its `vllm/` package and dist-info, slimmed (the
FlashAttention 3 library and DeepGEMM are left out: TurboQuant needs FlashAttention 2
and every scenario asks for it), as an xz tar split into parts of at most 64 MiB
together with this repository, for hosts reached through a size-limited copy; the
wheels vLLM and vllm-patch need that a CUDA PyTorch image lacks (cp312, manylinux);
and a manifest. `gpu/host.sh` assembles and runs it there.

    python gpu/bundle.py --out .gpu      # parts in .gpu/p1, .gpu/p2, ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "tool"))

from vllm_patch.infrastructure.downloads import fetch  # noqa: E402
from vllm_patch.lines import line_named  # noqa: E402

# The host's line: its release runs on the host's torch 2.11 and triton 3.6, and VLLM_DEPS are its release's
# (host.sh names the same line). A line on a newer torch travels in a stack bundle (stack_bundle.py).
LINE = "v0.20"

# Left out of the wheel: 144 MB of FlashAttention 3 (TurboQuant refuses FA >= 3) and DeepGEMM.
DROPPED = ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/third_party/deep_gemm/")

# What vLLM 0.20.0 imports that the GPU image lacks (versions that work together: newer
# majors of openai, pydantic and fastapi break vLLM 0.20.0's imports), then vllm-patch's own.
VLLM_DEPS = (
    "annotated-types==0.8.0", "astor==0.8.1", "blake3==1.0.11", "cachetools==8.0.1", "cbor2==6.2.1",
    "depyf==0.20.0", "dill==0.4.1", "diskcache==5.6.3", "distro==1.9.0", "fastapi==0.124.4", "gguf==0.19.0",
    "ijson==3.6.0", "jiter==0.19.0", "lark==1.2.2", "msgspec==0.22.0", "openai==2.54.0",
    "openai-harmony==0.0.8", "partial-json-parser==0.2.1.1.post7", "prometheus-fastapi-instrumentator==7.1.0",
    "pybase64==1.5.1", "pydantic==2.12.5", "pydantic-core==2.41.5", "python-json-logger==4.2.0",
    "pyzmq==27.3.0", "setproctitle==1.3.8", "sniffio==1.3.1", "starlette==0.50.0",
    "typing-extensions==4.16.0", "typing-inspection==0.4.5",
)
TOOL_DEPS = ("unidiff==1.0.1", "GitPython==3.2.1", "gitdb==4.0.12", "smmap==5.0.3", "platformdirs==4.14.7",
             "installer==1.1.0")
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64", "manylinux_2_5_x86_64",
             # NCCL's wheels (stack bundles) are manylinux_2_18, CUPTI's manylinux_2_25.
             "manylinux_2_18_x86_64", "manylinux_2_25_x86_64")
# A call to a GPU host carries 64 MiB: one part, its manifest and this repository's tracked files (4 MiB, with
# the GPU reports) must fit in one, so a part is staged in a single call (tests/gpu/test_bundle.py checks it).
CALL_BYTES = 64 * 2**20
PART_BYTES = 56 * 2**20


def kept(name: str) -> bool:
    """Whether a wheel member goes into the bundle."""
    return not any(name == d or (d.endswith("/") and name.startswith(d)) for d in DROPPED)


def slim_tar(wheel: Path, dest: Path) -> dict:
    """The wheel's kept members as dest (tar.xz, compressed by the xz binary on all cores)."""
    kept_bytes = dropped_bytes = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                if not kept(info.filename):
                    dropped_bytes += info.file_size
                    continue
                kept_bytes += info.file_size
                zf.extract(info, root)
        plain = dest.with_suffix("")
        with tarfile.open(plain, "w") as tar:
            for top in sorted(p.name for p in root.iterdir()):
                tar.add(root / top, arcname=top)
    subprocess.run(["xz", "-T0", "-6", "-f", str(plain)], check=True)
    return {"kept_bytes": kept_bytes, "dropped_bytes": dropped_bytes}


def split(path: Path, out: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """path cut into out/p1/NAME.000, out/p2/NAME.001, ... (one part per copy to the host)."""
    parts = []
    with open(path, "rb") as src:
        index = 0
        while chunk := src.read(part_bytes):
            target = out / f"p{index + 1}" / f"{path.name}.{index:03d}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(chunk)
            parts.append(target)
            index += 1
    return parts


def download(specs: tuple[str, ...], dest: Path, python: str = "3.12") -> list[str]:
    """The wheels of specs (no dependencies) for the host's CPython and x86_64: the names of all wheels in dest."""
    dest.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", "-d", str(dest)]
    for plat in PLATFORMS:
        args += ["--platform", plat]
    subprocess.run(args + list(specs), check=True)
    return sorted(p.name for p in dest.glob("*.whl"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=PROJECT / ".gpu")
    args = parser.parse_args()
    out: Path = args.out
    pin = line_named(PROJECT, LINE).load().pin
    wheel = fetch(pin.wheel)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "vllm.tar.xz"
        sizes = slim_tar(wheel, archive)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        parts = split(archive, out)
    last = parts[-1].parent
    wheels = download(VLLM_DEPS + TOOL_DEPS, last / "wheels")
    manifest = {
        "vllm_wheel": pin.wheel.filename, "vllm_wheel_sha256": pin.wheel.sha256,
        "dropped": list(DROPPED), **sizes, "archive": "vllm.tar.xz", "archive_sha256": digest,
        "parts": [str(p.relative_to(out)) for p in parts], "wheels": wheels,
        "note": f"{pin.wheel.filename} without {', '.join(DROPPED)} (FlashAttention 2 only)",
    }
    (last / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for p in sorted(out.iterdir()):
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        print(f"{p.name}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
