"""The verify kernel's own instruction mix: ``_tq_mq_verify_fwd`` compiled ahead of time (CPU, no GPU) for each
target with the current line's Triton, at the tiles its planner picks there and the arguments the backend's
launch passes (norm correction per preset, head-major slots, KV splits), its main loop disassembled (nvdisasm;
the AMDGCN text for gfx942) and counted by class, per cache token and M tile. Beside it, what
``roofline_projection.py`` counts from the source, and two floors the roofline leaves out: issue (every
instruction takes a scheduler slot: 4 warp-instructions per SM per clock on NVIDIA, one vector wave-instruction
per CU per clock on CDNA3) and shared memory (128 bytes per SM per clock; bank conflicts not counted), each over
the whole call's tokens at the card's datasheet clock.

Why: the roofline's ALU count is a floor from the source; the compiled loop shows what the kernel issues, and
where the H100's measured time goes beyond the roofline.

    PYTHONPATH=tool python benchmarks/roofline_sass_mix.py                 # the current line's kernel, Triton 3.8
    PYTHONPATH=tool python benchmarks/roofline_sass_mix.py --kernel FILE --targets sm_86,sm_90 --json

The kernel comes from the series (the tool's engine, as ``make gpu-fit``) unless --kernel names a file; the
compile runs in an interpreter with the line's Triton (``gpu/fit/fitsupport.triton_python``: this one when it has
it, else a venv made once under the cache).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "gpu" / "fit"))

TRITON_VERSION = "3.8.0"  # the current line's (vLLM 0.33's torch 2.14 stack)
TARGET_CARDS = {
    "sm_86": "RTX 3090",
    "sm_89": "RTX 4090",
    "sm_120": "RTX 5090",
    "sm_80": "A100 SXM4 80GB",
    "sm_90": "H100 SXM5",
    "gfx942": "MI300X",
}
GEOMETRY = "Qwen3.6-27B TP1"  # 24/4 heads of 256, fitmatrix's name
PRESETS = ("k8v4", "4bit_nc", "k3v4_nc", "3bit_nc")
CLASSES = ("tensor", "fp32", "fp16", "int", "cvt", "mufu", "shfl", "smem", "global", "local", "control", "scalar")
ALU_CLASSES = ("fp32", "fp16", "int", "cvt", "mufu", "shfl")

_NV = {
    "HMMA": "tensor",
    "IMMA": "tensor",
    "HGMMA": "tensor",
    "QGMMA": "tensor",
    "LDS": "smem",
    "STS": "smem",
    "LDSM": "smem",
    "STSM": "smem",
    "ATOMS": "smem",
    "LDG": "global",
    "STG": "global",
    "LDGSTS": "global",
    "RED": "global",
    "ATOM": "global",
    "LDL": "local",
    "STL": "local",
    "SHFL": "shfl",
    "MUFU": "mufu",
    "F2F": "cvt",
    "F2I": "cvt",
    "I2F": "cvt",
    "F2FP": "cvt",
    "I2FP": "cvt",
    "F2IP": "cvt",
    "FRND": "cvt",
    "FADD": "fp32",
    "FMUL": "fp32",
    "FFMA": "fp32",
    "FSETP": "fp32",
    "FSEL": "fp32",
    "FMNMX": "fp32",
    "FSET": "fp32",
    "FCHK": "fp32",
    "HADD2": "fp16",
    "HMUL2": "fp16",
    "HFMA2": "fp16",
    "HSETP2": "fp16",
    "HMNMX2": "fp16",
    "BRA": "control",
    "BAR": "control",
    "BSSY": "control",
    "BSYNC": "control",
    "WARPSYNC": "control",
    "EXIT": "control",
    "NOP": "control",
    "DEPBAR": "control",
    "YIELD": "control",
}


def classify_nvidia(op: str) -> str:
    """The class of a SASS opcode (its base, before the first dot)."""
    return _NV.get(op.split(".")[0], "int")


def smem_wavefronts_nvidia(op: str) -> int:
    """Shared-memory cycles of one warp instruction, conflict-free: 128 bytes a cycle; ldmatrix/stmatrix .xN
    move N 8x8 16-bit matrices (N cycles)."""
    base, *mods = op.split(".")
    if base in ("LDSM", "STSM"):  # LDSM.16.M88.4: four matrices
        return int(mods[-1]) if mods and mods[-1] in ("1", "2", "4") else 1
    width = next((int(m) // 8 for m in mods if m in ("64", "128")), 4)
    return max(1, 32 * width // 128)


def classify_amd(op: str) -> str:
    """The class of a CDNA3 mnemonic."""
    if op.startswith(("v_mfma", "v_smfmac")):
        return "tensor"
    if op.startswith("ds_"):
        return "shfl" if "bpermute" in op or "swizzle" in op else "smem"
    if op.startswith(("global_", "buffer_", "flat_")):
        return "global"
    if op.startswith("scratch_"):
        return "local"
    if op.startswith(("s_cbranch", "s_branch", "s_waitcnt", "s_barrier", "s_nop", "s_endpgm")):
        return "control"
    if op.startswith("s_"):
        return "scalar"
    if re.match(r"v_(exp|log|rcp|rsq|sqrt|sin|cos)_", op):
        return "mufu"
    if op.startswith("v_cvt"):
        return "cvt"
    if op.startswith("v_") and "f32" in op:
        return "fp32"
    if op.startswith("v_") and ("f16" in op or "bf16" in op):
        return "fp16"
    return "int"


def main_loop(lines: list[str], label_re: str, branch_re: str) -> tuple[int, int]:
    """(first, last) line of the widest backward branch's body: the kernel's loop over cache tiles."""
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(label_re, line))}
    best = None
    for i, line in enumerate(lines):
        m = re.search(branch_re, line)
        if m and labels.get(m.group(1), i) < i and (best is None or i - labels[m.group(1)] > best[1] - best[0]):
            best = (labels[m.group(1)], i)
    if best is None:
        raise ValueError("no backward branch: no loop found")
    return best


def loop_mix_nvidia(sass: str) -> tuple[Counter, int]:
    """Instruction counts by class in the main loop of nvdisasm output (one warp, one iteration), and its
    shared-memory cycles."""
    lines = sass.splitlines()
    first, last = main_loop(lines, r"^(\.L_x_\d+):", r"\bBRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?`\((\.L_x_\d+)\)")
    mix, smem = Counter(), 0
    for line in lines[first : last + 1]:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", line)
        if not m:
            continue
        cls = classify_nvidia(m.group(1))
        mix[cls] += 1
        if cls == "smem":
            smem += smem_wavefronts_nvidia(m.group(1))
    return mix, smem


def loop_mix_amd(asm: str) -> tuple[Counter, int]:
    """The same for AMDGCN text (one wavefront); LDS cycles at 128 bytes a cycle, ds ops of 64 lanes x width."""
    lines = asm.splitlines()
    first, last = main_loop(lines, r"^(\.LBB\d+_\d+):", r"s_c?branch\w*\s+(\.LBB\d+_\d+)")
    mix, smem = Counter(), 0
    for line in lines[first : last + 1]:
        m = re.match(r"\s+([a-z_][a-z0-9_]*)\b", line)
        if not m or m.group(1).startswith("."):
            continue
        cls = classify_amd(m.group(1))
        mix[cls] += 1
        if cls == "smem":
            width = next((int(n) // 8 for n in re.findall(r"b(\d+)", m.group(1))), 4)
            smem += max(1, 64 * max(width, 1) // 128)
    return mix, smem


# ---------------------------------------------------------------------------------------------------------
# The worker: runs in the interpreter with the line's Triton (no torch)
# ---------------------------------------------------------------------------------------------------------


def compile_case(mod, fm, target_name: str, preset_name: str, precision: str | None = None) -> dict:
    """Compile the split kernel as the backend launches it at batch 8 (several splits) for one target: at the
    planner's first tiles, or with the MSE score dot rewritten to precision (the source's tf32x3 replaced) at
    the tiles roofline_projection plans for it."""
    import roofline_projection as rp
    import triton
    from triton.compiler import ASTSource

    target, preset, geo = fm.TARGET[target_name], fm.PRESET[preset_name], fm.GEOMETRY[GEOMETRY]
    d, g, k1 = geo.head_dim, geo.group, 4
    limits = fm.limits_for(mod, target)
    tiles = mod.tq_mq_verify_candidates(k1, g, d, preset.mse_bits, preset.key_fp8, limits)[0]
    if precision and not preset.key_fp8:
        t = rp.plan_tiles(rp.CARD[TARGET_CARDS[target_name]], rp.PRESET[preset_name], rp.Shape(), precision)
        if "SCORE_PRECISION" in mod._tq_mq_verify_fwd.arg_names:  # the precision is the kernel's argument
            kernel_precision = precision
        else:  # SCORE_IEEE=0 takes the rewritten precision; ieee keeps the kernel's own branch
            kernel_precision = "ieee" if precision == "ieee" else "tf32x3"
        tiles = mod.TQMQTiles(t.block_m, t.m_tiles, t.block_n, kernel_precision)
    args = fm.probe_args(mod, tiles, fm.Config(target.name, preset_name, "bf16", 16, k1, GEOMETRY))
    slot = preset.key_packed_size(d) + math.ceil(d * preset.value_bits / 8) + 4
    slot += slot % 2
    hk, splits = geo.kv_heads, 16
    # vLLM's (blocks, Hk, block_size, slot) cache seen through transpose(1, 2); partials of several splits.
    args.update(
        stride_kv_block=hk * 16 * slot,
        stride_kv_pos=slot,
        stride_kv_head=16 * slot,
        SLOT_ALIGN=math.gcd(hk * 16 * slot, slot, 16 * slot, 16),
        NUM_SPLITS=splits,
        stride_mid_t=geo.q_heads * splits * (d + 1),
        stride_mid_h=splits * (d + 1),
        stride_mid_s=d + 1,
        NORM_CORRECTION=1 if preset.norm_correction else 0,
    )
    fn = mod._tq_mq_verify_fwd
    signature, constexprs, attrs = fm._compile_inputs(fn, target, args)
    options = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages, **mod.tq_mq_launch_options(target.hip)}
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=fm._gpu_target(target), options=options)
    if target.hip:
        mix, smem = loop_mix_amd(kernel.asm["amdgcn"])
        warp = 64
    else:
        nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            sass = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout
        mix, smem = loop_mix_nvidia(sass)
        warp = 32
    # FP8 keys score with a float16 dot whatever the MSE precision.
    label = "fp16" if preset.key_fp8 else precision or tiles.precision
    return dict(
        target=target_name,
        preset=preset_name,
        block_m=tiles.block_m,
        m_tiles=tiles.m_tiles,
        block_n=tiles.block_n,
        precision=label,
        num_warps=tiles.num_warps,
        warp=warp,
        shared=int(kernel.metadata.shared),
        loop=dict(mix),
        smem_cycles=smem,
        triton=triton.__version__,
    )


def worker(kernel_path: Path, targets: list[str], presets: list[str], precision: str | None) -> list[dict]:
    import fitmatrix as fm

    text = kernel_path.read_text()
    if precision and "SCORE_PRECISION" not in text:  # the score dot rewritten: a copy, loaded under its own name
        if 'input_precision="tf32x3"' not in text:
            raise SystemExit(f"{kernel_path} has no tf32x3 score dot to rewrite")
        tmp = Path(tempfile.mkdtemp()) / kernel_path.name
        tmp.write_text(text.replace('input_precision="tf32x3"', f'input_precision="{precision}"'))
        kernel_path = tmp
    mod = fm.load_kernel(kernel_path)
    out = []
    for target in targets:
        for preset in presets:
            try:
                out.append(compile_case(mod, fm, target, preset, precision))
            except Exception as e:  # a compile error, reported in the row
                out.append(dict(target=target, preset=preset, error=f"{type(e).__name__}: {str(e)[:300]}"))
    return out


# ---------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------


def per_token(row: dict) -> dict[str, float]:
    """Warp (wavefront) instructions per cache token and M tile, by class."""
    scale = row["num_warps"] / row["block_n"]
    return {cls: row["loop"].get(cls, 0) * scale for cls in CLASSES}


def floors(row: dict) -> dict:
    """The issue and shared-memory floors of the call's split kernel on the target's card at batch 8, 8k."""
    import roofline_projection as rp

    card = rp.CARD[TARGET_CARDS[row["target"]]]
    shape = rp.Shape()
    tiles = rp.Tiles(row["block_m"], row["m_tiles"], row["block_n"])
    tokens, _ = rp.split_tokens(shape, tiles, rp.num_splits(card, shape, tiles))
    token_programs = tokens * shape.batch * shape.kv_heads * row["m_tiles"]
    mix = per_token(row)
    clock = card.sms * card.clock_mhz * 1e6
    if card.hip:  # vector instructions, one wavefront a clock per CU
        issued = sum(v for k, v in mix.items() if k not in ("scalar", "control", "tensor"))
        issue_us = 1e6 * issued * token_programs / clock
    else:  # every instruction, four warps a clock per SM
        issue_us = 1e6 * sum(mix.values()) * token_programs / (4 * clock)
    smem_us = 1e6 * row["smem_cycles"] * row["num_warps"] / row["block_n"] * token_programs / clock
    analytic = rp.project(card, rp.PRESET[row["preset"]], shape, row["precision"])
    rp_tiles = rp.plan_tiles(card, rp.PRESET[row["preset"]], shape, row["precision"])
    analytic_lanes = analytic.alu_ops / (token_programs if str(rp_tiles) == str(tiles) else math.nan)
    compiled_lanes = sum(mix[c] for c in ALU_CLASSES) * row["warp"]
    return dict(
        card=card.name,
        issue_us=issue_us,
        smem_us=smem_us,
        roofline_us=analytic.time_us,
        roofline_bound=analytic.bound,
        analytic_alu_lanes=analytic_lanes,
        compiled_alu_lanes=compiled_lanes,
    )


def markdown(rows: list[dict]) -> str:
    out = [
        f"Main loop of `_tq_mq_verify_fwd` compiled for each target (Triton {rows[0].get('triton', '?')}), "
        "warp instructions per cache token and M tile by class; ALU lanes: compiled (fp32, fp16, int, cvt, "
        "mufu, shfl x warp width) against the roofline's source count; floors of the call's split kernel at "
        "batch 8, 8k context on the target's card.",
        "",
        "| target | preset | tiles | prec | shared B | total | tensor | fp32+fp16 | int | cvt | mufu | shfl | "
        "smem | global | local (spill) | ALU lanes compiled / source | issue floor us | smem floor us | "
        "roofline us |",
        "|---|---|---|---|--:|" + "--:|" * 14,
    ]
    for row in rows:
        if "error" in row:
            out.append(f"| {row['target']} | {row['preset']} | {row['error']} |" + " |" * 17)
            continue
        mix, f = per_token(row), floors(row)
        out.append(
            f"| {row['target']} | {row['preset']} | {row['block_m']}x{row['m_tiles']} n{row['block_n']} | "
            f"{row['precision']} | {row['shared']} | {sum(mix.values()):.0f} | {mix['tensor']:.1f} | "
            f"{mix['fp32'] + mix['fp16']:.0f} | {mix['int']:.0f} | {mix['cvt']:.1f} | {mix['mufu']:.1f} | "
            f"{mix['shfl']:.1f} | {mix['smem']:.0f} | {mix['global']:.1f} | {mix['local']:.1f} | "
            f"{f['compiled_alu_lanes']:.0f} / {f['analytic_alu_lanes']:.0f} | {f['issue_us']:.0f} | "
            f"{f['smem_us']:.0f} | {f['roofline_us']:.0f} {f['roofline_bound'][0].upper()} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", type=Path, help="a triton_turboquant_verify.py (default: the current line's)")
    parser.add_argument("--targets", default=",".join(TARGET_CARDS))
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument(
        "--score-precision",
        choices=("bf16x3", "bf16x6", "tf32", "bf16", "ieee"),
        help="compile the MSE score dot at this precision instead (the source rewritten)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    targets, presets = args.targets.split(","), args.presets.split(",")
    if args.worker:
        json.dump(worker(args.kernel, targets, presets, args.score_precision), sys.stdout)
        return 0
    from fitsupport import LINES, kernel_file, triton_python

    with tempfile.TemporaryDirectory() as tmp:
        kernel = args.kernel or kernel_file("current", Path(tmp))
        python = triton_python(LINES["current"][1])
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        extra = ["--score-precision", args.score_precision] if args.score_precision else []
        proc = subprocess.run(
            [
                str(python),
                __file__,
                "--worker",
                "--kernel",
                str(kernel),
                "--targets",
                args.targets,
                "--presets",
                args.presets,
                *extra,
            ],
            env=env,
            capture_output=True,
            text=True,
        )
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    rows = json.loads(proc.stdout)
    if args.json:
        print(
            json.dumps(
                [
                    dict(row, **({} if "error" in row else dict(per_token=per_token(row), **floors(row))))
                    for row in rows
                ],
                indent=1,
            )
        )
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
