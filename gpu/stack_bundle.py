"""Make the offline "stack bundle" of a release line whose vLLM needs another torch than the GPU host has, or the
host's torch with Python packages the host lacks.

The host has CUDA torch 2.11 and triton 3.6 (vLLM 0.20's stack); vLLM 0.33 pins torch 2.14.0, which needs triton
3.8, and vLLM 0.32 torch 2.13.0, which needs triton 3.7.1. The bundle carries a whole private site dir, unpacked
here from the wheels (slimmed) so the host needs neither pip nor xz: torch and triton, the nvidia-* libraries the
line's torch pins that the host's (torch 2.11's pins) cannot stand in for, the line's pinned vLLM wheel (slimmed as
gpu/bundle.py does, and more), and the pure-Python packages the line needs newer than the host's. One tar, cut
at the components' borders into separately xz-compressed streams (so the manifest gives each component's compressed
size), split into parts of at most 56 MiB in out/p01, out/p02, ...; every part folder holds the manifest (sha256 of
the archive and of each part). `gpu/stack.sh` stages, checks and unpacks it there into a prefix of its own,
never touching the host's torch.

    python gpu/stack_bundle.py --line current                # .gpu/v0.33/p01 ...
    python gpu/stack_bundle.py --line v0.33 --with cudnn     # the same line; also ship cuDNN 9.24 (~9 parts more)
    python gpu/stack_bundle.py --line v0.32                  # lines/v0.32: .gpu/v0.32/p01 ...
    python gpu/stack_bundle.py --line v0.27                  # lines/v0.27 (torch 2.13.0, as v0.32)
    python gpu/stack_bundle.py --line v0.25                  # lines/v0.25: on the host's torch 2.11.0

--line is `current` (the top-level series, pinned to vLLM 0.33.0 now), a folder of lines/, or vX.Y: the line pinned
to vLLM X.Y wherever it lives. A stack is named after its line's release (v0.33), whichever line that is now: the
output folder, the manifest and gpu/stack.sh's prefix use that name.

What travels, and why (v0.33; figures from the wheels' METADATA and their ELF symbols, torch 2.14.0+cu130):
- NCCL 2.30.7: libtorch_cuda.so 2.14 needs 11 functions NCCL 2.28.9 (torch 2.11's pin, the host's) lacks
  (ncclCommGrow, ncclCommSuspend, ncclPutSignal, ...), unversioned and strong: the old library fails at load time.
- not cuBLAS 13.1.1.3 (host 13.1.0.3), cuSPARSELt 0.8.1 (host 0.8.0), cuDNN 9.24 (host 9.19): same sonames, every
  symbol torch 2.14 takes from them is there in the host's; torch checks no cuBLAS/cuSPARSELt version, and its cuDNN
  check (runtime minor >= compile minor) runs only when cuDNN is used (convolutions, cuDNN SDPA), which an LLM with
  FlashAttention 2 does not; stack.sh sets PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 unless cuDNN travels (--with).
- the rest of torch 2.14's pins (cuda-toolkit 13.0.3: runtime, nvrtc, cufft, curand, cusolver, cusparse, cupti,
  cufile, nvjitlink, nvtx; nvshmem 3.4.5; cuda-bindings) are the versions torch 2.11 pins (its cuda-toolkit 13.0.2
  differs from 13.0.3 only in cuBLAS), already on the host.

v0.32 (torch 2.13.0+cu130, triton 3.7.1), the same way:
- NCCL 2.29.7: libtorch_cuda.so 2.13 needs 8 functions NCCL 2.28.9 lacks (ncclCommSuspend, ncclCommResume,
  ncclCommMemStats, ncclPutSignal, ncclSignal, ncclWaitSignal, ...), unversioned and strong, as for v0.33.
- not cuBLAS 13.1.1.3, cuSPARSELt 0.8.1, cuDNN 9.20 (host 9.19): the 177 cuBLAS, 16 cuSPARSELt and 84 cuDNN symbols
  torch 2.13's libraries take are all in the host's; cuDNN's check as for v0.33 (--with cudnn ships 9.20).
- the rest of torch 2.13's pins are torch 2.14's: cuda-toolkit 13.0.3, nvshmem 3.4.5, cuda-bindings.

v0.27 (vLLM 0.27.1 pins torch 2.13.0 too): v0.32's torch, triton and NCCL, for the same reasons; its own deps.

v0.25 (vLLM 0.25.1 pins torch 2.11.0 and torchvision 0.26.0: the host's own) is a stack on the host's torch: a
recipe whose torch is HOST (None) carries no torch, triton or nvidia-* component, only the slimmed vLLM wheel and
the Python packages the host lacks or has not been seen to have new enough (HOST_PACKAGES), so the archive has two
components, vllm and deps; the manifest says "host_torch": true, and stack.sh puts the prefix before the host's
site-packages as for any stack, which then supplies torch, triton, torchvision, numpy and the CUDA libraries.
One mechanism for every line that needs more than the host has (rather than gpu/bundle.py's, which installs
wheels on the host with pip and serves line v0.20 alone): stage/setup/run/scenarios/tests/bench are the same.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack_parts import sha256_file, write_manifest  # noqa: E402

from bundle import PART_BYTES, PROJECT, download, fetch, kept, split  # noqa: E402
from vllm_patch.lines import CURRENT, LINES_DIR, lines_of  # noqa: E402
from vllm_patch.series import Series  # noqa: E402

# Never loaded by a run: static libraries, C headers of the nvidia wheels.
DROPPED_ALWAYS = (".a",)
DROPPED_ALWAYS_DIRS = ("nvidia/nccl/include/", "nvidia/cudnn/include/", "nvidia/cu13/include/",
                       "nvidia/cusparselt/include/")
# torch: C++ headers and CMake files (for building extensions; vLLM's come compiled, and inductor's Triton code
# for CUDA graphs needs no C++ compiler), protoc (a build tool).
TORCH_DROPPED = ("torch/include/", "torch/share/", "torch/bin/protoc", "torch/bin/protoc-3.21.12.0",
                 "torch/bin/protoc-3.13.0.0")  # its versioned copy: 3.21.12.0 in torch 2.14, 3.13.0.0 in 2.13
# triton: Blackwell-only ptxas and CUPTI (sm_100+; the H100 is sm_90 and takes bin/ptxas), the disassemblers
# (triton.tools.disasm only), the test libraries and FileCheck (lit tests).
TRITON_DROPPED = ("triton/backends/nvidia/bin/ptxas-blackwell", "triton/backends/nvidia/bin/cuobjdump",
                  "triton/backends/nvidia/bin/nvdisasm", "triton/backends/nvidia/lib/cupti-blackwell/",
                  "triton/instrumentation/libGPUInstrumentationTestLib.so", "triton/plugins/libTritonPluginsTestLib.so",
                  "triton/FileCheck")
# vLLM, besides bundle.DROPPED (FlashAttention 3, DeepGEMM): the Rust frontend binary (opt-in, serve only) and the
# SM100 (Blackwell) attention sources compiled on first use there.
VLLM_DROPPED = ("vllm/vllm-rs", "vllm/third_party/fmha_sm100/")


# A recipe's torch (and triton) that is the host's own: nothing of torch, triton or the nvidia-* libraries travels.
HOST = None

# What the GPU host's image holds at known versions (a session's `pip list` there, 2026-11; the device notes list
# its other packages by name only): a host-torch stack leaves these home where its release allows them
# (tests/gpu/test_stack_bundle.py checks that it does).
HOST_PACKAGES = {
    "torch": "2.11.0", "triton": "3.6.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "numpy": "2.5.2",
    "transformers": "5.17.0", "huggingface-hub": "1.33.0", "tokenizers": "0.23.2", "safetensors": "0.8.0",
    "tiktoken": "0.14.0", "sentencepiece": "0.2.2",
}


@dataclass(frozen=True)
class Line:
    torch: str | None
    triton: str | None
    nvidia: tuple[str, ...]
    optional: dict[str, str]
    deps: tuple[str, ...]
    python: str = "3.12"
    host: str = "torch 2.11.0+cu130, triton 3.6.0 and torch 2.11's nvidia-* pins"
    why: dict[str, str] = field(default_factory=dict)

    @property
    def host_torch(self) -> bool:
        """Whether the line runs on the host's own torch and triton (none of them travels)."""
        return self.torch is HOST


# vLLM 0.33.0's Requires-Dist raised above vLLM 0.20's (or new), resolved together with gpu/bundle.py's
# VLLM_DEPS (which 0.33 still imports) for cp312 manylinux; left out: numpy and opencv-python-headless (the same
# requirement in 0.20 and 0.33: the host's serve, and numpy is bound to the host's numba), torch, triton and the
# nvidia/cuda wheels (their own components), torch's own requirements (sympy, networkx, jinja2: the host's), extras
# (fastapi[standard]), and the GPU packages vLLM imports only when asked (flashinfer, tilelang, cutlass-dsl, quack,
# humming, tokenspeed-mla, torchcodec, PyNvVideoCodec, fastsafetensors, instanttensor, nvtx).
# torchvision 0.29.0 (torch 2.14's) travels so that a host torchvision built for 2.11 is never imported with 2.14.
V033_DEPS = (
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "annotated-doc==0.0.7", "annotated-types==0.8.0",
    "anyio==4.16.0", "apache-tvm-ffi==0.1.11", "astor==0.8.1", "attrs==26.1.0", "blake3==1.0.11", "cachetools==8.0.1",
    "cbor2==6.2.1", "certifi==2026.10.19.post1", "cffi==2.1.1", "charset-normalizer==3.5.2", "click==8.5.1",
    "compressed-tensors==0.17.0", "cryptography==50.0.2", "depyf==0.20.0", "dill==0.4.1", "distro==1.9.0",
    "fastapi==0.136.3", "filelock==4.2.12", "frozenlist==1.8.0", "fsspec==2026.9.0", "h11==0.16.0", "hf-xet==1.8.0",
    "httpcore==1.0.9", "httpcore2==2.16.2", "httpx==0.28.1", "httpx2==2.16.2", "huggingface_hub==2.4.0",
    "idna==3.20", "ijson==3.6.0", "jiter==0.19.0", "jmespath==1.1.0", "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1", "lark==1.2.2", "llguidance==1.7.6", "loguru==0.7.3",
    "markdown-it-py==4.3.0", "mcp==2.3.0", "mcp-types==2.3.0", "mdurl==0.1.2", "mistral_common==1.13.1",
    "model-hosting-container-standards==0.1.16", "msgspec==0.22.0", "multidict==7.2.1", "openai==2.54.0",
    "opentelemetry-api==1.45.2", "orjson==3.13.0", "oss-harmony==0.0.11", "packaging==26.3",
    "partial-json-parser==0.2.1.1.post7", "pillow==13.0.0", "prometheus-fastapi-instrumentator==8.1.0",
    "prometheus_client==0.26.0", "propcache==0.5.4", "pybase64==1.5.1", "pycountry==26.2.16", "pycparser==3.12",
    "pydantic==2.14.4", "pydantic-extra-types==2.11.1", "pydantic_core==2.50.5", "Pygments==2.21.0",
    "PyJWT==2.15.1", "python-json-logger==4.2.0", "python-multipart==0.0.34", "PyYAML==6.0.4", "pyzmq==27.3.0",
    "referencing==0.37.0", "regex==2026.11.19", "requests==2.34.2", "rich==15.0.0", "rpds-py==2026.9.1",
    "safetensors==0.8.0", "setproctitle==1.3.8", "setuptools==80.10.2", "shellingham==1.5.4", "sniffio==1.3.1",
    "sse-starlette==3.7.0", "starlette==1.10.0", "supervisor==4.3.0", "tiktoken==0.14.0", "tokenizers==0.23.3",
    "torchvision==0.29.0", "tqdm==4.70.1", "transformers==5.20.2", "truststore==0.10.5", "typer==0.29.2",
    "typing-inspection==0.4.5", "typing_extensions==4.16.0", "urllib3==2.8.0", "uvicorn==0.54.0",
    "xgrammar==0.2.8", "yarl==1.25.1",
)

# vLLM 0.32.0's, made the same way, with V033_DEPS's versions wherever 0.32's Requires-Dist allows them (one
# snapshot for both stacks). It differs only in transformers (0.32: < 5.20.0), torchvision (0.28.0, torch 2.13's) and
# orjson (0.33 requires it; 0.32 imports it only in the hf3fs KV connector).
V033_ONLY = ("orjson==3.13.0", "transformers==5.20.2", "torchvision==0.29.0")
V032_DEPS = tuple(sorted(({*V033_DEPS} - {*V033_ONLY}) | {"transformers==5.19.0", "torchvision==0.28.0"},
                         key=lambda spec: spec.split("==")[0].lower()))

# vLLM 0.27.1's (torch 2.13.0 too: the v0.32 stack's torch, triton 3.7.1 and NCCL 2.29.7), made the same way, with
# V032_DEPS's versions wherever 0.27.1's Requires-Dist allows them. Its requirements are 0.32.0's or looser
# (transformers>=5.5.3, huggingface_hub only through transformers, aiohttp>=3.13.3, openai>=2.0.0, xgrammar<1.0.0,
# mcp unbounded, torchvision==0.28.0 as 0.32's), so one difference only: 0.27.1 requires and imports
# openai-harmony (openai_harmony), where 0.32 took its fork oss-harmony; 0.0.8, the version gpu/bundle.py's
# VLLM_DEPS carry for 0.20.
V032_ONLY = ("oss-harmony==0.0.11",)
V027_DEPS = tuple(sorted(({*V032_DEPS} - {*V032_ONLY}) | {"openai-harmony==0.0.8"},
                         key=lambda spec: spec.split("==")[0].lower()))

# vLLM 0.25.1's, on the host's torch 2.11.0 (its pin): V027_DEPS less what the host has at versions 0.25.1 and the
# other packages here accept (HOST_PACKAGES: transformers 5.17.0, huggingface-hub 1.33.0, tokenizers 0.23.2,
# safetensors 0.8.0, tiktoken 0.14.0; torchvision 0.26.0 is 0.25.1's pin, built for the host's torch), with these
# differences: apache-tvm-ffi 0.1.9 (0.25.1 pins ==0.1.9, for FlashInfer 0.6.13), so xgrammar 0.2.3 (the newest
# that takes tvm-ffi 0.1.9: 0.2.6 and later need >= 0.1.10, and 0.2.5.post1 wants transformers < 5), and
# diskcache 5.6.3 (0.25.1 pins it; 0.27 dropped it). The packages the host has at versions nobody recorded
# (pydantic's typing-extensions, aiohttp, setuptools < 81, ...) travel at V027_DEPS's, as the other stacks carry them.
# Checked here against the Requires-Dist of vLLM 0.25.1, of every wheel carried and of the five left home: no
# conflict but mistral_common 1.13.1's numpy<2.4 against the host's 2.5.2, which the v0.32 and v0.33 stacks share.
V025_LEAVES = ("huggingface_hub==2.4.0", "safetensors==0.8.0", "tiktoken==0.14.0", "tokenizers==0.23.3",
               "torchvision==0.28.0", "transformers==5.19.0", "apache-tvm-ffi==0.1.11", "xgrammar==0.2.8")
V025_DEPS = tuple(sorted(({*V027_DEPS} - {*V025_LEAVES})
                         | {"apache-tvm-ffi==0.1.9", "xgrammar==0.2.3", "diskcache==5.6.3"},
                         key=lambda spec: spec.split("==")[0].lower()))

# The stack of torch 2.13.0 (vLLM 0.27 to 0.32): the same torch, triton and NVIDIA libraries for each of its lines.
TORCH_2_13 = {
    "torch": "torch==2.13.0", "triton": "triton==3.7.1", "nvidia": ("nvidia-nccl-cu13==2.29.7",),
    "optional": {"cudnn": "nvidia-cudnn-cu13==9.20.0.48", "cublas": "nvidia-cublas==13.1.1.3",
                 "cusparselt": "nvidia-cusparselt-cu13==0.8.1"},
    "why": {"nvidia-nccl-cu13": "libtorch_cuda.so needs 8 symbols NCCL 2.28.9 lacks (ncclCommSuspend, ...)"},
}

LINES = {
    "v0.25": Line(
        torch=HOST, triton=HOST, nvidia=(), optional={}, deps=V025_DEPS,
        host="torch 2.11.0+cu130, triton 3.6.0, torchvision 0.26.0 and the packages of HOST_PACKAGES: the stack's own",
    ),
    "v0.27": Line(**TORCH_2_13, deps=V027_DEPS),
    "v0.32": Line(**TORCH_2_13, deps=V032_DEPS),
    "v0.33": Line(
        torch="torch==2.14.0", triton="triton==3.8.0",
        nvidia=("nvidia-nccl-cu13==2.30.7",),
        optional={"cudnn": "nvidia-cudnn-cu13==9.24.0.43", "cublas": "nvidia-cublas==13.1.1.3",
                  "cusparselt": "nvidia-cusparselt-cu13==0.8.1"},
        deps=V033_DEPS,
        why={"nvidia-nccl-cu13": "libtorch_cuda.so needs 11 symbols NCCL 2.28.9 lacks (ncclCommGrow, ...)"},
    ),
}


def release_name(series: Series) -> str:
    """vX.Y of the release a series is pinned to: the name of its stack (0.33.0: v0.33)."""
    return "v" + ".".join(series.pin.version.split(".")[:2])


def resolve(name: str, project: Path = PROJECT) -> tuple[str, Series]:
    """The stack name and the series of line `name`: `current`, a folder of lines/, or vX.Y (the line pinned to
    vLLM X.Y). A name that is none of them, or a line without a stack recipe in LINES, is a SystemExit."""
    lines = lines_of(project)
    chosen = next((line for line in lines if line.name == name), None)
    if chosen is None:
        chosen = next((line for line in lines if release_name(line.load()) == name), None)
    if chosen is None:
        raise SystemExit(f"stack_bundle: no release line {name!r}: neither {CURRENT!r}, a folder of "
                         f"{project / LINES_DIR}, nor vX.Y of a line's release ("
                         + ", ".join(f"{line.name}: {release_name(line.load())}" for line in lines) + ")")
    series = chosen.load()
    stack = release_name(series)
    if stack not in LINES:
        raise SystemExit(f"stack_bundle: line {chosen.name} (vLLM {series.pin.version}) has no stack recipe; "
                         f"there are: {', '.join(sorted(LINES))}")
    return stack, series


def matches(name: str, rules: tuple[str, ...]) -> bool:
    """Whether name is one of rules (a rule ending in / is a folder)."""
    return any(name == r or (r.endswith("/") and name.startswith(r)) for r in rules)


def dropped(name: str, rules: tuple[str, ...] = ()) -> bool:
    """Whether an installed file stays home: static libraries and headers always, the component's rules, and
    bundle.py's slimming of vLLM."""
    return (name.endswith(DROPPED_ALWAYS) or matches(name, DROPPED_ALWAYS_DIRS) or matches(name, rules)
            or not kept(name))


def installed_name(member: str) -> str | None:
    """Where a wheel member lands in a --target site dir (None: scripts, headers and data stay home)."""
    top, _, rest = member.partition("/")
    if top.endswith(".data"):
        kind, _, path = rest.partition("/")
        return path if kind in ("purelib", "platlib") and path else None
    return member


def add_wheel(tar: tarfile.TarFile, wheel: Path, rules: tuple[str, ...], seen: set[str]) -> dict:
    """wheel's files, as installed, into tar (straight from the zip); the kept and dropped byte counts."""
    kept_bytes = dropped_bytes = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            name = installed_name(info.filename)
            if name is None or dropped(name, rules) or name in seen:
                dropped_bytes += info.file_size
                continue
            seen.add(name)
            entry = tarfile.TarInfo(name)
            entry.size = info.file_size
            entry.mtime = int(time.mktime((*info.date_time, 0, 0, -1)))
            entry.mode = (info.external_attr >> 16) & 0o777 or 0o644
            with zf.open(info) as src:
                tar.addfile(entry, src)
            kept_bytes += info.file_size
    return {"wheel": wheel.name, "kept_bytes": kept_bytes, "dropped_bytes": dropped_bytes}


def _wheels(specs: tuple[str, ...], dest: Path, python: str) -> list[Path]:
    """bundle.download's wheels as paths."""
    return [dest / name for name in download(specs, dest, python)]


@dataclass(frozen=True)
class Reusable:
    """A component of a made stack bundle (out/pNN of another stack), whose xz stream may stand for this one's."""
    stack: str
    level: int
    component: dict
    parts: tuple[tuple[Path, int], ...]  # the part files and their sizes, in order
    offset: int  # where the component's stream starts in the archive

    def read(self) -> Iterator[bytes]:
        """The component's xz stream, in blocks, from the part files."""
        start, left = self.offset, self.component["xz_bytes"]
        for path, size in self.parts:
            if start >= size:
                start -= size
                continue
            with open(path, "rb") as f:
                f.seek(start)
                while left and (block := f.read(min(left, 1 << 22))):
                    left -= len(block)
                    yield block
            start = 0
            if not left:
                return
        if left:
            raise SystemExit(f"stack_bundle: stack {self.stack}'s parts end before its {self.component['name']}")


def reusable(folder: Path) -> dict[str, Reusable]:
    """The components of the stack bundle in folder (its pNN part folders, e.g. .gpu/v0.32), by name."""
    manifests = sorted(folder.glob("p*/manifest.json"))
    if not manifests:
        raise SystemExit(f"stack_bundle: --reuse {folder}: no stack bundle there (no pNN/manifest.json)")
    manifest = json.loads(manifests[0].read_text())
    parts = tuple((folder / part["path"], part["bytes"]) for part in manifest["parts"])
    missing = [str(path) for path, _ in parts if not path.exists()]
    if missing:
        raise SystemExit(f"stack_bundle: --reuse {folder}: parts missing: {', '.join(missing)}")
    found, offset = {}, 0
    for component in manifest["components"]:
        found[component["name"]] = Reusable(manifest["line"], manifest["xz_level"], component, parts, offset)
        offset += component["xz_bytes"]
    return found


def same_stream(reused: Reusable, src, start: int, end: int) -> bool:
    """Whether reused's xz stream decompresses to exactly src's bytes [start, end)."""
    src.seek(start)
    left = end - start
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    for block in reused.read():
        if decompressor.eof:
            return False
        data = decompressor.decompress(block)
        if len(data) > left or src.read(len(data)) != data:
            return False
        left -= len(data)
    return decompressor.eof and left == 0


def compress_slices(plain: Path, cuts: list[tuple[str, int, int]], archive: Path, level: int,
                    reuse: dict[str, Reusable] | None = None) -> tuple[dict[str, int], dict[str, str]]:
    """archive: each [start, end) of plain as its own xz stream, one after the other (xz and Python's lzma read
    them as one); each component's compressed size, and the components whose stream came from reuse (another
    stack's, at the same xz level, checked to decompress to exactly this one's bytes) instead of xz."""
    sizes, reused = {}, {}
    with open(archive, "wb") as out, open(plain, "rb") as src:
        for name, start, end in cuts:
            before = out.tell()
            other = (reuse or {}).get(name)
            if other is not None and other.level == level and same_stream(other, src, start, end):
                for block in other.read():
                    out.write(block)
                out.flush()  # before an xz process writes to the same file descriptor
                sizes[name] = out.tell() - before
                reused[name] = other.stack
                continue
            proc = subprocess.Popen(["xz", "-T0", f"-{level}", "-c"], stdin=subprocess.PIPE, stdout=out)
            src.seek(start)
            left = end - start
            while left:
                block = src.read(min(left, 1 << 22))
                proc.stdin.write(block)
                left -= len(block)
            proc.stdin.close()
            if proc.wait():
                raise SystemExit(f"stack_bundle: xz failed on {name}")
            out.flush()
            sizes[name] = out.tell() - before
    return sizes, reused


def build(line_name: str, out: Path, extras: tuple[str, ...], work: Path, level: int = 6,
          part_bytes: int = PART_BYTES, wheels: dict[str, list[Path]] | None = None, python: str | None = None,
          reuse: Path | None = None) -> dict:
    """The bundle of line line_name (see resolve) in out/pNN. wheels (component name -> wheel files) replaces the
    downloads, python the line's Python (tests). reuse: another stack bundle's folder (.gpu/v0.32), whose
    components' xz streams stand for this one's where they hold exactly the same bytes (v0.27's torch, triton and
    NCCL are v0.32's), which saves xz most of its time."""
    line_name, series = resolve(line_name)
    line = LINES[line_name]
    python = python or line.python
    if wheels is None:
        pin = series.pin
        dl = work / "wheels"
        nvidia = line.nvidia + tuple(line.optional[e] for e in extras)
        wheels = {} if line.host_torch else {
            "torch": _wheels((line.torch,), dl / "torch", line.python),
            "triton": _wheels((line.triton,), dl / "triton", line.python),
            "nvidia": _wheels(nvidia, dl / "nvidia", line.python),
        }
        wheels |= {
            "vllm": [fetch(pin.wheel)],
            "deps": _wheels(line.deps, dl / "deps", line.python),
        }
    expected = ["vllm", "deps"] if line.host_torch else ["torch", "triton", "nvidia", "vllm", "deps"]
    if list(wheels) != expected:
        raise SystemExit(f"stack_bundle: stack {line_name} is made of {', '.join(expected)}, not {', '.join(wheels)}")
    rules = {"torch": TORCH_DROPPED, "triton": TRITON_DROPPED, "vllm": VLLM_DROPPED}
    plain = work / "stack.tar"
    cuts, components, seen, start = [], [], set(), 0
    with tarfile.open(plain, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, files in wheels.items():
            added = [add_wheel(tar, w, rules.get(name, ()), seen) for w in files]
            end = tar.offset
            cuts.append((name, start, end))
            components.append({"name": name, "wheels": [a["wheel"] for a in added],
                               "kept_bytes": sum(a["kept_bytes"] for a in added),
                               "dropped_bytes": sum(a["dropped_bytes"] for a in added)})
            start = end
    # the tar's end-of-archive blocks go with the last component
    cuts[-1] = (cuts[-1][0], cuts[-1][1], plain.stat().st_size)
    archive = work / "stack.tar.xz"
    sizes, reused = compress_slices(plain, cuts, archive, level, reusable(reuse) if reuse else None)
    plain.unlink()
    for c in components:
        c["xz_bytes"] = sizes[c["name"]]
    digest = sha256_file(archive)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    parts = [_renumber(p, out) for p in split(archive, out, part_bytes)]
    note = (f"stack {line_name}: " + ("the host's torch and triton, " if line.host_torch else "")
            + ", ".join(Path(w).name for c in components if c["name"] != "deps" for w in c["wheels"])
            + f" (slimmed) + {len(components[-1]['wheels'])} Python packages; xz -{level}")
    info = {"line": line_name, "python": python, "host": line.host, "host_torch": line.host_torch,
            "xz_level": level,
            "components": components, "dropped": {k: list(v) for k, v in rules.items()},
            "dropped_always": [*DROPPED_ALWAYS, *DROPPED_ALWAYS_DIRS], "why": line.why,
            "cudnn_travels": any("cudnn" in w for c in components for w in c["wheels"]), "note": note,
            "reused": reused}
    manifest = write_manifest(out, parts, archive, digest, info)
    archive.unlink()
    return manifest


def _renumber(part: Path, out: Path) -> Path:
    """bundle.split's out/pN/NAME.NNN as out/pNN/NAME.NNN (folders that sort in order)."""
    index = int(part.parent.name[1:])
    folder = out / f"p{index:02d}"
    if folder != part.parent:
        part.parent.rename(folder)
    return folder / part.name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--line", default=CURRENT, help="the release line: current (default), a folder of lines/, "
                        "or vX.Y (the line pinned to vLLM X.Y); stacks: " + ", ".join(sorted(LINES)))
    parser.add_argument("--out", type=Path, help="default .gpu/vX.Y (the line's release)")
    parser.add_argument("--with", dest="extras", default="", help="comma-separated: " + ", ".join(
        sorted({e for line in LINES.values() for e in line.optional})) + " (nvidia libraries that need not travel)")
    parser.add_argument("--level", type=int, default=6, choices=range(0, 10), help="xz preset (default 6)")
    parser.add_argument("--work", type=Path, help="scratch folder (default a temporary one in /tmp)")
    parser.add_argument("--reuse", type=Path, help="a made stack bundle's folder (e.g. .gpu/v0.32): its xz streams "
                        "of components identical to this stack's (same wheels, same bytes, same --level) are copied "
                        "instead of compressed again")
    args = parser.parse_args()
    stack, _ = resolve(args.line)
    out = args.out or PROJECT / ".gpu" / stack
    extras = tuple(e for e in args.extras.split(",") if e)
    unknown = [e for e in extras if e not in LINES[stack].optional]
    if unknown:
        parser.error(f"--with {','.join(unknown)}: not one of {', '.join(sorted(LINES[stack].optional))}")
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        manifest = build(stack, out, extras, Path(tmp), args.level, reuse=args.reuse)
    for c in manifest["components"]:
        source = f" (stack {manifest['reused'][c['name']]}'s stream)" if c["name"] in manifest["reused"] else ""
        print(f"{c['name']:7} {c['kept_bytes'] / 2**20:8.1f} MiB kept, {c['dropped_bytes'] / 2**20:7.1f} MiB dropped, "
              f"xz -{args.level}: {c['xz_bytes'] / 2**20:7.1f} MiB{source}  ({', '.join(c['wheels'][:4])}"
              f"{', ...' if len(c['wheels']) > 4 else ''})")
    total = manifest["archive_bytes"]
    print(f"archive {total / 2**20:.1f} MiB, sha256 {manifest['archive_sha256']}: {len(manifest['parts'])} parts "
          f"in {out}/p01..p{len(manifest['parts']):02d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
