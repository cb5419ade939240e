"""Series against the real vLLM 0.20.0 sources, shared by the integration tests and
the benchmark. The edits are small, marked, and placed on real lines of the files
the project's fixes touch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from helpers import build_series
from vllm_patch.engine.anchors import find_block

TQ = "vllm/v1/attention/backends/turboquant_attn.py"
GDN = "vllm/v1/attention/backends/gdn_attn.py"
CONV = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"
RUNNER = "vllm/v1/worker/gpu_model_runner.py"
GDN_LAYER = "vllm/model_executor/layers/mamba/gdn_linear_attn.py"
ARGS = "vllm/engine/arg_utils.py"
NEW_KERNEL = "vllm/v1/attention/ops/vp_test_kernel.py"

# The lines 2495-2501 of gpu_model_runner.py occur again at 2544-2550: a hunk changing
# line 2498 with 3 lines of context has an anchor that matches twice.
AMBIGUOUS_LINE = "                req.prompt_token_ids, req.prompt_embeds\n"
AMBIGUOUS_AT = (2495, 2544)


def replace_once(data: bytes, old: str, new: str) -> bytes:
    assert data.count(old.encode()) == 1, f"{old!r} is not unique"
    return data.replace(old.encode(), new.encode())


def mark_line(data: bytes, lineno: int, tag: str) -> bytes:
    """Append a comment to 1-based line `lineno` (a real, stable edit)."""
    lines = data.split(b"\n")
    lines[lineno - 1] += f"  # {tag}".encode()
    return b"\n".join(lines)


def sample_series_steps(tree: Path) -> tuple[dict[str, bytes], list[tuple[str, dict[str, bytes | None]]]]:
    """Four patches on real files: a change plus a new Triton module, an insertion,
    two edits in one file across two patches, and a change in the model runner."""
    base = {p: (tree / p).read_bytes() for p in (TQ, GDN, CONV, RUNNER)}
    policy = "    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH\n"
    tq = replace_once(base[TQ], policy, "    # vllm-patch test: capture policy\n" + policy)
    gdn = replace_once(base[GDN], "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n",
                       "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n"
                       "    spec_decode_src_indices: torch.Tensor | None = None  # vllm-patch test\n")
    conv1 = replace_once(base[CONV], "def causal_conv1d_fn(\n", "def causal_conv1d_fn(  # vllm-patch test 1\n")
    conv2 = mark_line(conv1, 20, "vllm-patch test 2")
    runner = mark_line(base[RUNNER], 2240, "vllm-patch test")
    kernel = b'"""A new Triton module shipped by the series (test)."""\n\nKERNEL_VERSION = 1\n'
    steps = [
        ("TurboQuant: test change with a new kernel module", {TQ: tq, NEW_KERNEL: kernel}),
        ("GDN: test metadata field", {GDN: gdn}),
        ("conv1d: first test edit", {CONV: conv1}),
        ("conv1d: second test edit on top of the first", {CONV: conv2, RUNNER: runner}),
    ]
    return base, steps


def ambiguous_steps(tree: Path):
    base = {RUNNER: (tree / RUNNER).read_bytes()}
    lines = base[RUNNER].decode().split("\n")
    assert lines[AMBIGUOUS_AT[0] + 2] + "\n" == AMBIGUOUS_LINE
    lines[AMBIGUOUS_AT[0] + 2] = lines[AMBIGUOUS_AT[0] + 2] + "  # vllm-patch ambiguous"
    return base, [("runner: a hunk whose anchor occurs twice", {RUNNER: "\n".join(lines).encode()})]


def bench_steps(tree: Path, count: int, start: int = 40,
                files: tuple[str, ...] = (TQ, GDN, CONV, RUNNER, GDN_LAYER, ARGS)) -> tuple[dict[str, bytes], list]:
    """`count` patches over `files`, each marking lines far apart (unique anchors)."""
    base = {p: (tree / p).read_bytes() for p in files}
    current = dict(base)
    steps = []
    for i in range(count):
        path = files[i % len(files)]
        n = current[path].count(b"\n")
        lineno = start + (i // len(files)) * 97 % max(1, n - start - 40)
        lines = current[path].split(b"\n")
        # Skip blank lines and lines whose 7-line window (the hunk's anchor) repeats.
        while not lines[lineno - 1].strip() or len(find_block(lines, lines[lineno - 4:lineno + 3])) != 1:
            lineno += 1
        current[path] = mark_line(current[path], lineno, f"vllm-patch bench {i}")
        steps.append((f"bench patch {i}", {path: current[path]}))
    return base, steps


def make_series(dest: Path, base, steps) -> Path:
    return build_series(dest, base, steps)


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def make_venv(dest: Path, wheel: Path | None) -> Path:
    """A throwaway virtualenv with a vLLM wheel installed (``--no-deps``), or none.

    A failure names the command, the free space where the venv goes (a vLLM wheel unpacks to over
    1 GB) and the end of pip's output, so a run log that keeps only the first lines of a
    traceback still says why."""
    run_logged([sys.executable, "-m", "venv", str(dest)], dest)
    py = dest / "bin" / "python"
    if wheel is not None:
        run_logged([str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    str(wheel)], dest)
    return py


def run_logged(cmd: list[str], where: Path) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        free = shutil.disk_usage(where.parent).free / 2**30
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode} ({free:.1f} GiB free under "
                           f"{where.parent}):\n" + "\n".join(tail))


def rebase_steps(tree: Path):
    """Four patches for a 0.20.0 -> 0.21.0 rebase. 0.21.0 changed causal_conv1d.py's
    lines 40 and 48 (``tl.constexpr`` -> ``tl.int64``) and left gdn_attn.py alone:
    - gdn_attn.py gets a field: applies as is (clean);
    - line 42 of causal_conv1d.py gets a comment: its anchor holds line 40, so it needs
      the 3-way merge (merged);
    - line 40 becomes what 0.21.0 has (upstreamed);
    - line 48 becomes ``tl.int32`` where 0.21.0 says ``tl.int64`` (conflict)."""
    base = {p: (tree / p).read_bytes() for p in (GDN, CONV)}
    gdn = replace_once(base[GDN], "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n",
                       "    num_accepted_tokens: torch.Tensor | None = None  # shape: [batch,]\n"
                       "    spec_decode_src_indices: torch.Tensor | None = None  # vllm-patch test\n")
    merged = replace_once(base[CONV], "    stride_w_width: tl.constexpr,  # stride to get to next width-axis value\n",
                          "    stride_w_width: tl.constexpr,  # stride to get to next width-axis value (rebase test)\n")
    upstream = replace_once(merged, "    stride_x_token: tl.constexpr,  # stride to get to next token (same",
                            "    stride_x_token: tl.int64,  # stride to get to next token (same")
    lines = upstream.split(b"\n")
    assert lines[47] == b"    stride_o_token: tl.constexpr,"
    lines[47] = b"    stride_o_token: tl.int32,"
    conflict = b"\n".join(lines)
    return base, [
        ("GDN: clean rebase test", {GDN: gdn}),
        ("conv1d: merge rebase test", {CONV: merged}),
        ("conv1d: upstreamed rebase test", {CONV: upstream}),
        ("conv1d: conflict rebase test", {CONV: conflict}),
    ]
