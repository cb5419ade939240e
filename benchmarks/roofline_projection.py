"""A roofline for the cards we cannot run: the multi-query TurboQuant verify call (query rotation, split kernel,
reduce; patch 0003's ``triton_turboquant_verify.py``) projected from an analytic count of its work and each card's
datasheet peak rates, checked against the H100 measurement of ``bench_tq_mq_roofline.py``.

Pure Python, no GPU, no torch. Each kernel of the call takes max(HBM bytes / bandwidth, tensor FLOPs / tensor
rate, ALU ops / ALU rate); the call is the sum of its kernels, and its bound is the split kernel's. The count
follows the kernel source at the tiles its planner picks for the card (``tq_mq_verify_candidates``: the widest
BLOCK_M whose staged dot operands fit the card's shared memory, then the widest BLOCK_N):

- bytes: every slot of the requests (B x L x Hk x slot, as the benchmark counts them), the block table, the
  queries (for MSE keys the rotated queries, written by the rotation and read by the split kernel), the split
  partials written and read back by the reduce, the output. A second M tile reads the same slots again; those
  reads are counted once (the programs of one (request, KV head, split) run side by side and share them through
  L2), their ALU work twice.
- tensor FLOPs: 2 x BLOCK_M x D per token for the scores and as many for P x V, BLOCK_M being the padded tile
  (K1 x G = 24 rows in a tile of 32). P x V and FP8-key scores are float16 dots with float32 accumulation; MSE
  scores take the score precision: tf32x3 three TF32 passes, bf16x3 three BF16 passes, bf16x6 six, tf32 and bf16
  one; ieee is Triton's FMA dot on NVIDIA's CUDA cores (its FMAs join the ALU count) and an FP32 matrix dot on
  CDNA3.
- ALU ops, counted from the source as lane operations in classes (fp32, int, cvt, mufu, shfl): per key or value
  element the dequantization (byte extract, nibble mask and shift or a 3-bit field's two-byte combine, the
  centroid gather or select tree, norm correction, the score operand's split), per token the slot and load
  addresses, per score the mask, row max, exp2 and the value scale and zero, per accumulator element the
  rescale. Per-SM rates from the CUDA C++ Programming Guide's throughput table (AMD: the CDNA3 ISA); ALU time =
  max(all ops / issue rate, each class / its rate). The compiler emits more than the source asks for (address
  arithmetic, operand staging through shared memory, spills), so the count is a floor.

A roofline is a lower bound: the H100 check prints measured / projected per preset, and that ratio above 1 is the
kernel's inefficiency against its own work, not a constant to fit.

Score precision: the budget is the tests' log-sum-exp tolerance (2e-3) at scaled scores of --max-score (the
kernel's docstring: real models' scores reach tens); a precision holds it when its relative error per product
times that score stays under the tolerance (tf32x3, bf16x6, bf16x3 and ieee do; tf32 and bf16 do not). The
precision a card should use is the fastest that holds it on tensor or matrix cores (ieee on NVIDIA is an FMA dot
whose FMAs are not what bounds it: the roofline would flatter it), ties (within 2%) to the more exact. The
what-if table adds kernel changes (``CHANGES``): their projected effect, not measurements.

    PYTHONPATH=tool python benchmarks/roofline_projection.py            # Markdown tables and the H100 check
    python benchmarks/roofline_projection.py --json                     # the same figures as JSON
    python benchmarks/roofline_projection.py --context 32768 --batch 32
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu" / "fit"))
import fitmatrix  # noqa: E402

HERE = Path(__file__).resolve().parent
REPORTS = HERE.parent / "tests" / "gpu" / "reports"
H100_REPORTS = tuple(
    REPORTS / f"bench-tq-mq-roofline-v0.33-h100-{d}-line-run{r}.txt" for d in ("d256", "d128") for r in (1, 2)
)
LSE_TOLERANCE = 2e-3  # tests/lines/v0_33/test_tq_mq_verify.py, LSE_TOL's atol
TIE = 1.02  # precisions within 2% of the fastest count as equally fast


# ---------------------------------------------------------------------------------------------------------
# Score precisions
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """How the MSE score dot runs: tensor passes of one type (tf32, bf16, fp16; fp32 = Triton's ieee), bytes a
    staged query and key operand element takes, the key operand's split per element (lane ops by class), and the
    relative error of one product (2u for one pass, u the operand format's unit roundoff: TF32 and float16 2^-11,
    BF16 2^-8; about 3u^2 for a hi/lo split; float32's 2^-24 for ieee)."""

    name: str
    passes: int
    pass_type: str
    query_bytes: int
    key_bytes: int
    key_split: dict[str, float]
    product_error: float
    triton: bool = True  # an input_precision of tl.dot (else a kernel change)


PRECISION = {
    p.name: p
    for p in (
        Precision("tf32x3", 3, "tf32", 8, 8, {"fp32": 3}, 3 * 2.0**-22),
        # Triton's BF16 splits (TritonGPU BF16DotTC): hi, mid (and lo) by truncate, extend, subtract.
        Precision("bf16x6", 6, "bf16", 6, 6, {"cvt": 1.5, "int": 2, "fp32": 2}, 2.0**-22),
        Precision("bf16x3", 3, "bf16", 4, 4, {"cvt": 1, "int": 1, "fp32": 1}, 3 * 2.0**-16),
        Precision("ieee", 1, "fp32", 4, 4, {}, 2.0**-24),
        Precision("tf32", 1, "tf32", 4, 4, {"fp32": 1}, 2.0**-10),
        Precision("bf16", 1, "bf16", 2, 2, {"cvt": 0.5}, 2.0**-7),
        # A kernel change: the rotated query split once into float16 hi and lo, against the codebook value itself
        # (the 16 or 8 centroids rounded once to float16; norm correction on the score column): two float16 passes,
        # 22 bits of the query, the key exact.
        Precision("fp16x2", 2, "fp16", 4, 2, {}, 2 * 2.0**-22, triton=False),
        # The kernel's own split on CUDA: the query and the gathered centroids into float16 hi and lo parts, three
        # float16 passes (hi x hi, hi x lo, lo x hi).
        Precision("fp16x3", 3, "fp16", 4, 4, {"cvt": 2, "fp32": 1}, 3 * 2.0**-22, triton=False),
    )
}
PRECISIONS = ("tf32x3", "bf16x6", "bf16x3", "ieee", "tf32", "bf16")  # tl.dot's, the table's columns

# Kernel changes the what-if table projects (analysis; the kernel has none of them).
CHANGES = {
    "fp16x2": (
        "MSE scores as two float16 passes: the rotated query split into float16 hi and lo against the codebook "
        "value itself (centroids rounded once to float16, the norm correction applied to the score column instead "
        "of the key tile)"
    ),
    "pv_fp16_acc": (
        "P x V in float16-accumulating MMAs within a tile (BLOCK_N 32: two k16 steps, one rounding more than the "
        "float16 p x scale operands already take), added to the float32 accumulator once a tile: GeForce cards run "
        "them at twice the float32-accumulating rate"
    ),
    "word_fields": (
        "3-bit fields read as 32-bit words and cut with funnel shifts, 3-bit centroids gathered from an 8-entry "
        "register table as 4-bit ones are, instead of two byte loads and a select tree per element"
    ),
}


# ---------------------------------------------------------------------------------------------------------
# Cards: published peak rates
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """One target's datasheet figures (dense tensor rates with FP32 accumulation; TFLOPS, GB/s, MHz) and the
    per-SM per-clock lane rates of its ALU classes."""

    name: str
    arch: str  # sm_86 ... or gfx942
    sms: int  # SMs (CUs on AMD)
    clock_mhz: float  # the boost clock the datasheet's rates assume
    bandwidth_gbs: float
    fp32_tflops: float  # non-tensor FP32 (FMA = 2 FLOPs)
    fp16_tflops: float  # FP16 / BF16 tensor, FP32 accumulate (GeForce: half the FP16-accumulate rate)
    fp16_acc16_tflops: float  # FP16 tensor, FP16 accumulate
    tf32_tflops: float
    max_shared: int  # opt-in shared memory (LDS) per block, bytes: what the planner fits tiles into
    source: str
    fp32_matrix_tflops: float | None = None  # FP32 matrix cores (CDNA3): where ieee dots run there
    hip: bool = False
    # lanes per SM per clock: issue (all classes together), fp32, int (add, logic, shift, IMAD, select), cvt,
    # mufu (exp2, sqrt, reciprocal), shfl (warp shuffles; ds_bpermute on AMD)
    lanes: dict[str, int] = field(default_factory=dict)

    @property
    def capability(self) -> int:
        return 0 if self.hip else int(self.arch[3:])

    @property
    def hw_fp8(self) -> bool:
        """e4m3 keys convert in hardware from sm_89 on; sm_80/86 (e4b15) and gfx942 (OCP e4m3, which CDNA3 does
        not convert natively) use integer ops."""
        return not self.hip and self.capability >= 89

    def available(self, precision: str) -> bool:
        """Triton's dot input precisions here: CUDA tf32, tf32x3, ieee, bf16x3, bf16x6 (and bf16 operands);
        gfx942 ieee, tf32 (xf32), bf16x3, bf16x6: no tf32x3. fp16x2 is a kernel change, on either."""
        return not (self.hip and precision == "tf32x3")

    def kernel_precision(self) -> str:
        """tq_mq_score_precision: tf32x3 on CUDA sm_80 and newer, ieee on ROCm."""
        return "ieee" if self.hip else "tf32x3"

    def pass_tflops(self, pass_type: str) -> float | None:
        """The tensor rate of one pass, None where the dot runs on the ALUs (ieee on NVIDIA)."""
        return {
            "tf32": self.tf32_tflops,
            "bf16": self.fp16_tflops,
            "fp16": self.fp16_tflops,
            "fp16_acc16": self.fp16_acc16_tflops,
            "fp32": self.fp32_matrix_tflops,
        }[pass_type]


_GUIDE = "lanes: CUDA C++ Programming Guide, arithmetic instruction throughput"
_NV_LANES = {
    86: dict(issue=128, fp32=128, int=64, cvt=16, mufu=16, shfl=32),
    80: dict(issue=128, fp32=64, int=64, cvt=16, mufu=16, shfl=32),
}
# CDNA3: four SIMD16 per CU run a wave64 instruction in four clocks (64 lanes per clock; packed FP32 not
# counted), transcendentals at a quarter rate, ds_bpermute through the LDS at half.
_CDNA3_LANES = dict(issue=64, fp32=64, int=64, cvt=64, mufu=16, shfl=32)

# Datasheet figures, one card a row: name, arch, SMs, boost MHz, GB/s, FP32, FP16/BF16 tensor (FP32 accumulate),
# FP16 tensor (FP16 accumulate), TF32 tensor (dense TFLOPS), opt-in shared memory per block (B), source.
# fmt: off
CARDS: tuple[Card, ...] = (
    Card("RTX 3090",       "sm_86",  82,  1695, 936.2,  35.6,  71.0,   142.0,  35.6,  101376,
         f"NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3090); {_GUIDE}", lanes=_NV_LANES[86]),
    Card("RTX A5000",      "sm_86",  64,  1695, 768.0,  27.8,  111.1,  111.1,  55.6,  101376,
         f"NVIDIA Ampere GA102 whitepaper and RTX A5000 datasheet; {_GUIDE}", lanes=_NV_LANES[86]),
    Card("RTX A6000",      "sm_86",  84,  1800, 768.0,  38.7,  154.8,  154.8,  77.4,  101376,
         f"NVIDIA Ampere GA102 whitepaper and RTX A6000 datasheet; {_GUIDE}", lanes=_NV_LANES[86]),
    Card("RTX 4090",       "sm_89",  128, 2520, 1008.0, 82.6,  165.2,  330.3,  82.6,  101376,
         f"NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090); {_GUIDE}", lanes=_NV_LANES[86]),
    Card("RTX 5090",       "sm_120", 170, 2407, 1792.0, 104.8, 209.5,  419.0,  104.8, 101376,
         f"NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090); {_GUIDE}", lanes=_NV_LANES[86]),
    Card("A100 SXM4 80GB", "sm_80",  108, 1410, 2039.0, 19.5,  312.0,  312.0,  156.0, 166912,
         f"NVIDIA A100 Tensor Core GPU datasheet; {_GUIDE}", lanes=_NV_LANES[80]),
    Card("H100 SXM5",      "sm_90",  132, 1980, 3350.0, 66.9,  989.4,  989.4,  494.7, 232448,
         f"NVIDIA H100 Tensor Core GPU datasheet (SXM5); {_GUIDE}", lanes=_NV_LANES[86]),
    Card("MI300X",         "gfx942", 304, 2100, 5300.0, 81.7,  1307.4, 1307.4, 653.7, 65536,
         "AMD Instinct MI300X datasheet (its FP32 vector 163.4 TFLOPS counts packed FP32; 81.7 unpacked); lanes: AMD "
         "CDNA3 instruction set architecture", fp32_matrix_tflops=163.4, hip=True, lanes=_CDNA3_LANES),
)
# fmt: on
CARD = {c.name: c for c in CARDS}


# ---------------------------------------------------------------------------------------------------------
# Presets, shape, tiles
# ---------------------------------------------------------------------------------------------------------


class Preset(fitmatrix.Preset):
    """A TurboQuant preset's slot: gpu/fit/fitmatrix.py's table (vLLM's TQ_PRESETS and TurboQuantConfig: key
    bits, 8 = FP8 keys), with the byte counts the projection reads."""

    def mse_bytes(self, d: int) -> int:
        return math.ceil(d * self.mse_bits / 8)

    def value_data_bytes(self, d: int) -> int:
        return math.ceil(d * self.value_bits / 8)

    def slot_size(self, d: int) -> int:
        return self.key_packed_size(d) + self.value_data_bytes(d) + 4

    def slot_size_aligned(self, d: int) -> int:
        return self.slot_size(d) + self.slot_size(d) % 2


PRESETS = tuple(Preset(**asdict(p)) for p in fitmatrix.PRESETS)
PRESET = {p.name: p for p in PRESETS}


@dataclass(frozen=True)
class Shape:
    """The verify call: Qwen3.6-27B's attention (24/4 heads of 256), MTP K=3, batch 8, 8k context."""

    head_dim: int = 256
    q_heads: int = 24
    kv_heads: int = 4
    k1: int = 4
    batch: int = 8
    context: int = 8192  # seq_len of each request, its K1 new tokens included (as the benchmark sets it)
    block_size: int = 16
    max_splits: int = 32

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def rows(self) -> int:
        return self.k1 * self.group


@dataclass(frozen=True)
class Tiles:
    """BLOCK_M rows in M_TILES tiles and BLOCK_N tokens a step, as the kernel's TQMQTiles."""

    block_m: int
    m_tiles: int
    block_n: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.m_tiles} n{self.block_n}"


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def staged_bytes(block_m: int, block_n: int, d: int, preset: Preset, precision: str) -> int:
    """tq_mq_staged_bytes (its figures for tf32x3 and ieee; the operand bytes of the others): float16 key tiles
    for FP8 keys; the query tile and one key tile (4-bit keys: half the depth) for MSE keys."""
    if preset.key_fp8:
        return 2 * block_n * d
    p = PRECISION[precision]
    depth = d // 2 if preset.mse_bits == 4 else d
    return p.query_bytes * block_m * d + p.key_bytes * block_n * depth


def _widest_block_n(d: int, preset: Preset, block_m: int, card: Card) -> int:
    """_widest_block_n of the kernel file."""
    block_n = 128 if d <= 128 else 64
    # Halved once: 3-bit keys (a full-width centroid tile), 64-row 4-bit tiles on sm_8x and 32-row 4-bit tiles at
    # D=256 on CUDA (ptxas spills).
    halve = not preset.key_fp8 and (
        preset.mse_bits != 4
        or (block_m == 64 and not card.hip and 80 <= card.capability < 90)
        or (d == 256 and block_m >= 32 and not card.hip)
    )
    return block_n // 2 if halve else block_n


def plan_tiles(card: Card, preset: Preset, shape: Shape, precision: str) -> Tiles:
    """The first of tq_mq_verify_candidates for the card's shared memory: the widest BLOCK_M (at most 64 up to
    D=128, 32 at 256), then the widest BLOCK_N, halved down to 16; tiles of 16 tokens after the others. The
    compiled kernel has the last word on a GPU (the probe); this is the planner's first choice."""
    d = shape.head_dim
    widest_m = max(16, min(_next_pow2(shape.rows), 64 if d <= 128 else 32))
    widest_n = _widest_block_n(d, preset, 16, card)
    fits = []
    block_m = widest_m
    while block_m >= 16:
        block_n = _widest_block_n(d, preset, block_m, card)
        while block_n >= 16:
            if staged_bytes(block_m, block_n, d, preset, precision) <= card.max_shared:
                fits.append(Tiles(block_m, -(-shape.rows // block_m), block_n))
            block_n //= 2
        block_m //= 2
    fits.sort(key=lambda t: t.block_n < min(32, widest_n))
    if not fits:
        raise ValueError(f"no tiling of {preset.name} fits {card.name}'s {card.max_shared} B")
    return fits[0]


def num_splits(card: Card, shape: Shape, tiles: Tiles) -> int:
    """tq_mq_verify_num_splits: four programs per SM, at most max_splits."""
    programs = shape.batch * shape.kv_heads * tiles.m_tiles
    return max(1, min(-(-4 * card.sms // programs), shape.max_splits))


def split_tokens(shape: Shape, tiles: Tiles, splits: int) -> tuple[int, int]:
    """(tokens a program steps over, summed over one request's splits and padded to BLOCK_N; splits holding
    tokens): _tq_mq_split_len's even share of at least 4 x BLOCK_N tokens, in whole tiles."""
    n = tiles.block_n
    length = -(-max(-(-shape.context // splits), 4 * n) // n) * n
    spans = [min(length, shape.context - s * length) for s in range(splits) if s * length < shape.context]
    return sum(-(-span // n) * n for span in spans), len(spans)


# ---------------------------------------------------------------------------------------------------------
# The count
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """Lane operations of one class per unit: token (slot), key / value element, score (row x token),
    acc (accumulator element per tile step), row_step (row per tile step), query (query element per program)."""

    what: str
    cls: str  # fp32, int, cvt, mufu, shfl
    unit: str
    count: float


def slot_alignment(preset: Preset, shape: Shape) -> int:
    """SLOT_ALIGN of the launch: gcd of the cache's strides (head-major pages) and 16."""
    slot = preset.slot_size_aligned(shape.head_dim)
    return math.gcd(slot, shape.block_size * slot, 16)


def _scale_zero_word(preset: Preset, shape: Shape) -> bool:
    """Scale and zero in one 32-bit load (the kernel's SLOT_ALIGN % 4 == 0 branch)."""
    d = shape.head_dim
    return slot_alignment(preset, shape) % 4 == 0 and (preset.key_packed_size(d) + preset.value_data_bytes(d)) % 4 == 0


def loads_per_token(preset: Preset, shape: Shape, changes: frozenset[str] = frozenset()) -> int:
    """Load instructions per slot as the source issues them: contiguous fields in words of the slot alignment (at
    most 4 bytes), 3-bit fields two bytes per element (lo, hi; with word_fields one 32-bit word per 4 bytes),
    the MSE key norm as two bytes, the value scale and zero as one word where aligned, else four bytes."""
    d = shape.head_dim
    word = min(slot_alignment(preset, shape), 4)
    if preset.key_fp8:
        keys = d // word
    elif preset.mse_bits == 4:
        keys = preset.mse_bytes(d) // word + 2
    else:
        keys = (-(-preset.mse_bytes(d) // 4) if "word_fields" in changes else 2 * d) + 2
    if preset.value_bits == 3:
        values = -(-preset.value_data_bytes(d) // 4) if "word_fields" in changes else 2 * d
    else:
        values = preset.value_data_bytes(d) // word
    return keys + values + (1 if _scale_zero_word(preset, shape) else 4)


def split_kernel_ops(
    card: Card, preset: Preset, shape: Shape, precision: str, changes: frozenset[str] = frozenset()
) -> list[Op]:
    """The split kernel's ALU work, from _tq_mq_verify_fwd's source (lane operations per unit)."""
    d = shape.head_dim
    words = "word_fields" in changes
    ops = [
        Op("slot address: block-table index, 64-bit page x stride and position x stride", "int", "token", 16),
        Op(
            "load addresses and masks (64-bit add, predicate), per load instruction",
            "int",
            "token",
            3 * loads_per_token(preset, shape, changes),
        ),
    ]
    # Keys.
    if preset.key_fp8:
        if card.hw_fp8:
            ops.append(Op("FP8 e4m3 to float16, two per conversion", "cvt", "key", 0.5))
        else:
            ops.append(Op("FP8 to float16 by integer ops (byte permute, mask, shift, or)", "int", "key", 2))
        ops.append(Op("score x softmax scale", "fp32", "score", 1))
    else:
        p = PRECISION[precision]
        if preset.mse_bits == 4:
            ops += [
                Op("key byte extract, nibble mask and shift (3 per byte)", "int", "key", 1.5),
                Op("centroid gather from the register table (a shuffle)", "shfl", "key", 1),
            ]
        elif words:
            ops += [
                Op("3-bit key field cut from a word (funnel shift, mask)", "int", "key", 2),
                Op("centroid gather from an 8-entry register table (a shuffle)", "shfl", "key", 1),
            ]
        else:
            ops += [
                Op("3-bit key field: two bytes combined, shifted, masked", "int", "key", 4),
                Op("centroid select tree: 3 bit tests, 7 selects", "int", "key", 13),
            ]
        if preset.norm_correction:
            ops += [
                Op("norm correction: sum of c^2", "fp32", "key", 1),
                Op("norm correction: sum across lanes (butterfly)", "shfl", "token", 10),
                Op("norm correction: sqrt and reciprocal", "mufu", "token", 2),
            ]
            if precision != "fp16x2":  # fp16x2 scales the score column, which the key norm multiply does
                ops.append(Op("norm correction: c x 1/|c|", "fp32", "key", 1))
        ops += [
            Op("key norm: two bytes combined", "int", "token", 3),
            Op("key norm: float16 to float32", "cvt", "token", 1),
            Op("score x key norm x softmax scale", "fp32", "score", 1),
        ]
        for cls, n in p.key_split.items():
            ops.append(Op(f"centroid operand to {precision} ({cls})", cls, "key", n))
        if precision == "fp16x2":
            ops.append(Op("query to float16 hi and lo (once a program)", "fp32", "query", 3))
        elif p.key_split:
            ops.append(Op(f"query operand to {precision} (once a program)", "fp32", "query", sum(p.key_split.values())))
        if p.passes > 1:
            ops.append(Op("NaN guard on the split dot's partial sum: compare, select", "fp32", "score", 2))
        if p.pass_type == "fp32" and card.pass_tflops("fp32") is None:
            ops.append(Op("score dot on CUDA cores (ieee): one FMA per product", "fp32", "score", d))
    # Values.
    if preset.value_bits == 4:
        ops += [
            Op("value byte extract, nibble mask and shift (3 per byte)", "int", "value", 1.5),
            Op("nibble | 0x6400 (float16 1024 + n)", "int", "value", 1),
            Op("minus 1024, in float16 pairs", "fp32", "value", 0.5),
        ]
    elif words:
        ops += [
            Op("3-bit value field cut from a word (funnel shift, mask)", "int", "value", 2),
            Op("index to float16", "cvt", "value", 1),
        ]
    else:
        ops += [
            Op("3-bit value field: two bytes combined, shifted, masked", "int", "value", 4),
            Op("index to float16", "cvt", "value", 1),
        ]
    ops += [
        Op("value scale and zero: unpack", "int", "token", 2 if _scale_zero_word(preset, shape) else 6),
        Op("value scale and zero: float16 to float32", "cvt", "token", 2),
        Op("p x value scale", "fp32", "score", 1),
        Op("p x scale to float16, two per conversion", "cvt", "score", 0.5),
        Op("p x value zero, summed (the zeros' rank-1 term)", "fp32", "score", 1),
    ]
    # Softmax.
    ops += [
        Op("causal and length mask: compare, and", "int", "score", 2),
        Op("causal and length mask: select", "fp32", "score", 1),
        Op("row max", "fp32", "score", 1),
        Op("s - m", "fp32", "score", 1),
        Op("exp2 of the scores", "mufu", "score", 1),
        Op("l += p", "fp32", "score", 1),
        Op("row reductions (max, sum p, sum p x zero) across an MMA quad", "shfl", "row_step", 24),
        Op("alpha = exp2(m_old - m_new)", "mufu", "row_step", 1),
        Op("m, alpha, l and zero-term updates", "fp32", "row_step", 6),
        Op("accumulator x alpha", "fp32", "acc", 1),
    ]
    return ops


@dataclass
class Kernel:
    """One kernel of the call: its HBM bytes, dot FLOPs by pass type (fp16, bf16, tf32, fp32) and ALU lane ops
    by class."""

    name: str
    bytes: dict[str, float]
    tensor_flops: dict[str, float]
    alu: dict[str, float]

    def terms(self, card: Card) -> dict[str, float]:
        """Seconds each bound needs on card."""
        mem = sum(self.bytes.values()) / (card.bandwidth_gbs * 1e9)
        tensor = 0.0
        for pass_type, flops in self.tensor_flops.items():
            rate = card.pass_tflops(pass_type)
            if rate is None:
                raise ValueError(f"{pass_type} dots have no tensor rate on {card.name}")
            tensor += flops / (rate * 1e12)
        clock = card.sms * card.clock_mhz * 1e6
        alu = max(
            [sum(self.alu.values()) / (card.lanes["issue"] * clock)]
            + [ops / (card.lanes[cls] * clock) for cls, ops in self.alu.items()]
        )
        return {"memory": mem, "tensor": tensor, "alu": alu}


@dataclass
class Projection:
    """One call on one card at one score precision (and kernel changes): its time, bound and counts."""

    card: str
    preset: str
    precision: str
    changes: list[str]
    tiles: str
    splits: int
    time_us: float  # the call: each kernel at its roofline, summed
    bound: str  # the split kernel's: memory, tensor or alu
    terms_us: dict[str, float]  # the split kernel's three terms
    kernels_us: dict[str, float]  # each kernel's largest term
    bytes: float  # all kernels' HBM bytes
    cache_bytes: float
    tensor_flops: float  # the split kernel's, all passes, padded rows
    alu_ops: float  # the split kernel's lane operations
    dequant_ops_per_element: float  # per key or value element and M tile
    alu_by_class: dict[str, float]


def count(
    card: Card, preset: Preset, shape: Shape, precision: str, changes: frozenset[str] = frozenset()
) -> list[Kernel]:
    """The call's kernels with their bytes, dot FLOPs and ALU ops."""
    d, b, hq, hk, k1 = shape.head_dim, shape.batch, shape.q_heads, shape.kv_heads, shape.k1
    tiles = plan_tiles(card, preset, shape, precision)
    splits = num_splits(card, shape, tiles)
    tokens, used_splits = split_tokens(shape, tiles, splits)
    programs = b * hk * tiles.m_tiles
    steps = tokens // tiles.block_n
    rows = b * k1 * hq
    mse = not preset.key_fp8
    scale = {
        "token": tokens,
        "key": tokens * d,
        "value": tokens * d,
        "score": tokens * tiles.block_m,
        "acc": steps * tiles.block_m * d,
        "row_step": steps * tiles.block_m,
        "query": used_splits * tiles.block_m * d,
    }
    alu: dict[str, float] = {}
    for op in split_kernel_ops(card, preset, shape, precision, changes):
        alu[op.cls] = alu.get(op.cls, 0.0) + op.count * scale[op.unit] * programs
    dot = 2 * tiles.block_m * d * tokens * programs  # one of the two dots, padded rows
    tensor = {"fp16_acc16" if "pv_fp16_acc" in changes else "fp16": float(dot)}
    if not mse:
        tensor["fp16"] = tensor.get("fp16", 0.0) + dot
    else:
        p = PRECISION[precision]
        if card.pass_tflops(p.pass_type) is not None:  # else the FMAs are in the ALU count
            tensor[p.pass_type] = tensor.get(p.pass_type, 0.0) + p.passes * dot
    partials = rows * used_splits * (d + 1) * 4 if splits > 1 else 0
    fwd_bytes = {
        "cache slots": b * shape.context * hk * preset.slot_size(d),
        "block table": b * -(-shape.context // shape.block_size) * 4,
        "queries": rows * d * (4 if mse else 2),
    }
    fwd_bytes.update({"partials written": partials} if splits > 1 else {"output": rows * d * 2})
    kernels = [Kernel("split", fwd_bytes, tensor, alu)]
    if mse:  # the query rotation, an ieee dot of the queries with PiT
        rot_bytes = {"queries": rows * d * 2, "PiT": d * d * 4, "rotated queries": rows * d * 4}
        rot_flops = 2 * rows * d * d
        if card.pass_tflops("fp32") is None:
            kernels.insert(0, Kernel("rotate", rot_bytes, {}, {"fp32": rot_flops / 2}))
        else:
            kernels.insert(0, Kernel("rotate", rot_bytes, {"fp32": rot_flops}, {}))
    if splits > 1:
        kernels.append(
            Kernel(
                "reduce",
                {"partials read": partials, "output": rows * d * 2},
                {},
                {"fp32": rows * used_splits * (2 * d + 8), "mufu": rows * used_splits * 2},
            )
        )
    return kernels


def dequant_ops(
    card: Card, preset: Preset, shape: Shape, precision: str, changes: frozenset[str] = frozenset()
) -> float:
    """Lane operations per key or value element that turn bytes into dot operands (the score operand's split
    included), per M tile."""
    ops = split_kernel_ops(card, preset, shape, precision, changes)
    return sum(op.count for op in ops if op.unit in ("key", "value")) / 2


def project(
    card: Card, preset: Preset, shape: Shape, precision: str, changes: frozenset[str] = frozenset()
) -> Projection:
    """The call's projected time on card: each kernel at its roofline, summed."""
    kernels = count(card, preset, shape, precision, changes)
    tiles = plan_tiles(card, preset, shape, precision)
    per = {k.name: k.terms(card) for k in kernels}
    fwd = per["split"]
    split_kernel = next(k for k in kernels if k.name == "split")
    return Projection(
        card.name,
        preset.name,
        precision,
        sorted(changes),
        str(tiles),
        num_splits(card, shape, tiles),
        time_us=1e6 * sum(max(t.values()) for t in per.values()),
        bound=max(fwd, key=fwd.get),
        terms_us={k: 1e6 * v for k, v in fwd.items()},
        kernels_us={name: 1e6 * max(t.values()) for name, t in per.items()},
        bytes=sum(sum(k.bytes.values()) for k in kernels),
        cache_bytes=split_kernel.bytes["cache slots"],
        tensor_flops=sum(split_kernel.tensor_flops.values()),
        alu_ops=sum(split_kernel.alu.values()),
        dequant_ops_per_element=dequant_ops(card, preset, shape, precision, changes),
        alu_by_class=dict(split_kernel.alu),
    )


def holds_budget(precision: str, max_score: float) -> bool:
    """Whether scores of max_score at this precision move the log-sum-exp by less than the tests' tolerance."""
    return PRECISION[precision].product_error * max_score <= LSE_TOLERANCE


def eligible(card: Card, precision: str, max_score: float) -> bool:
    """A precision the card should consider: it holds the budget and runs on tensor or matrix cores (ieee on
    NVIDIA is Triton's FMA dot, whose operand traffic and spills the roofline does not see)."""
    p = PRECISION[precision]
    return holds_budget(precision, max_score) and card.pass_tflops(p.pass_type) is not None


def kernel_precision(card: Card, preset: Preset) -> str:
    return "fp16" if preset.key_fp8 else card.kernel_precision()


def project_all(card: Card, preset: Preset, shape: Shape) -> dict[str, Projection]:
    """The Triton precisions that apply to the card; FP8 keys score in float16 whatever the setting."""
    if preset.key_fp8:
        return {"fp16": project(card, preset, shape, card.kernel_precision())}
    return {p: project(card, preset, shape, p) for p in PRECISIONS if card.available(p)}


def recommend(card: Card, projections: dict[str, Projection], max_score: float) -> str:
    """The fastest eligible precision; within TIE of it, the most exact."""
    if "fp16" in projections:
        return "fp16"
    ok = {p: proj for p, proj in projections.items() if eligible(card, p, max_score)}
    best = min(proj.time_us for proj in ok.values())
    return next(p for p in sorted(ok, key=lambda p: PRECISION[p].product_error) if ok[p].time_us <= best * TIE)


def what_if(card: Card, preset: Preset, shape: Shape, max_score: float) -> list[tuple[str, Projection]]:
    """The call today, at the precision it should use, then with the kernel changes added one by one."""
    today = project(card, preset, shape, card.kernel_precision())
    if preset.key_fp8:
        return [
            ("today", today),
            ("pv_fp16_acc", project(card, preset, shape, card.kernel_precision(), frozenset({"pv_fp16_acc"}))),
        ]
    rec = recommend(card, project_all(card, preset, shape), max_score)
    steps = [
        ("today", today),
        (rec, project(card, preset, shape, rec)),
        ("fp16x2", project(card, preset, shape, "fp16x2")),
    ]
    changes: frozenset[str] = frozenset()
    if preset.mse_bits == 3 or preset.value_bits == 3:
        changes = frozenset({"word_fields"})
        steps.append(("fp16x2 + word_fields", project(card, preset, shape, "fp16x2", changes)))
    steps.append(
        (
            " + ".join(["fp16x2", *sorted(changes), "pv_fp16_acc"]),
            project(card, preset, shape, "fp16x2", changes | {"pv_fp16_acc"}),
        )
    )
    return steps


# ---------------------------------------------------------------------------------------------------------
# The H100 check
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One row of a bench_tq_mq_roofline.py report: what the projection is checked against."""

    report: str
    preset: str
    head_dim: int
    context: int
    batch: int
    k1: int
    q_heads: int
    kv_heads: int
    tiles: str
    cache_mb: float  # the report's MB: the requests' slot bytes
    line_us: float  # median of the current line's kernel (the ``new`` candidate), else ``kernel``
    stream_us: float  # median of the layout's own stream
    copy_gbs: float


_ROW = re.compile(
    r"^(?P<preset>\S+)\s+(?P<d>\d+)\s+(?P<ctx>\d+)\s+(?P<b>\d+)\s+(?P<k1>\d+)\s+(?P<hq>\d+)/(?P<hk>\d+)\s"
)
_TIMING = re.compile(r"(\d+(?:\.\d+)?) \[\d+(?:\.\d+)?-\d+(?:\.\d+)?\]")
_TILES = re.compile(r"\b(\d+x\d+ n\d+) w\d+\b")


def parse_report(path: Path) -> list[Measured]:
    """The rows of a bench_tq_mq_roofline.py report: timings in its column order (kernel, in L2, stream,
    dequant, then each candidate's); the line's kernel is the ``new`` candidate where there is one."""
    text = path.read_text()
    copy = re.search(r"device-to-device copy: (\d+(?:\.\d+)?) GB/s", text)
    header = next((line for line in text.splitlines() if line.startswith("preset ")), "")
    has_new = " new us" in header
    out = []
    for line in text.splitlines():
        m = _ROW.match(line)
        times = [float(t) for t in _TIMING.findall(line)]
        if not m or "skipped" in line or len(times) < 4:
            continue
        tiles = _TILES.findall(line)
        new = has_new and len(times) > 4
        cache_mb = float(line.split()[10])  # after preset D ctx B K1 Hq/Hk, the tiles' three words and spl
        out.append(
            Measured(
                path.name,
                m["preset"],
                int(m["d"]),
                int(m["ctx"]),
                int(m["b"]),
                int(m["k1"]),
                int(m["hq"]),
                int(m["hk"]),
                tiles[-1] if new else tiles[0],
                cache_mb,
                times[4] if new else times[0],
                times[2],
                float(copy.group(1)) if copy else 0.0,
            )
        )
    return out


def h100_check(paths: tuple[Path, ...] = H100_REPORTS) -> list[dict]:
    """Measured / projected for every row of the H100 reports (the H100 SXM5 at the kernel's tf32x3)."""
    card = CARD["H100 SXM5"]
    rows = []
    for path in paths:
        if not path.is_file():
            continue
        for m in parse_report(path):
            shape = Shape(
                head_dim=m.head_dim, q_heads=m.q_heads, kv_heads=m.kv_heads, k1=m.k1, batch=m.batch, context=m.context
            )
            proj = project(card, PRESET[m.preset], shape, card.kernel_precision())
            cache_us = proj.cache_bytes / (card.bandwidth_gbs * 1e3)
            rows.append(
                dict(
                    report=m.report,
                    preset=m.preset,
                    head_dim=m.head_dim,
                    context=m.context,
                    batch=m.batch,
                    tiles_measured=m.tiles,
                    tiles_projected=proj.tiles,
                    cache_mb_measured=m.cache_mb,
                    cache_mb_projected=proj.cache_bytes / 1e6,
                    measured_us=m.line_us,
                    projected_us=proj.time_us,
                    ratio=m.line_us / proj.time_us,
                    bound=proj.bound,
                    terms_us=proj.terms_us,
                    kernels_us=proj.kernels_us,
                    stream_us=m.stream_us,
                    cache_at_peak_us=cache_us,
                    stream_ratio=m.stream_us / cache_us,
                    copy_gbs=m.copy_gbs,
                )
            )
    return rows


def ratios_by_preset(check: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in check:
        out.setdefault(r["preset"], []).append(r["ratio"])
    return out


# ---------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------


def _cell(p: Projection) -> str:
    return f"{p.time_us:.0f} {p.bound[0].upper()}"


def markdown(shape: Shape, cards: list[Card], presets: list[Preset], max_score: float, check: list[dict]) -> str:
    """The projection, the what-ifs, the instruction mix, the H100 check and the peak rates, as Markdown."""
    out = [
        f"Verify call at D={shape.head_dim}, {shape.q_heads}/{shape.kv_heads} heads (G={shape.group}), "
        f"K+1={shape.k1}, batch {shape.batch}, context {shape.context}: projected us of the call (rotation, "
        "split kernel, reduce), each kernel at its roofline; the letter is the split kernel's bound (M memory, "
        f"T tensor, A ALU). Bold: the precision the card should use (budget: scores of {max_score:g}); `*`: the "
        "kernel's today; `x`: fails the budget (roofline only). FP8 keys score in float16 at any setting.",
        "",
    ]
    head = ["card", "preset", "tiles today", "splits"] + list(PRECISIONS) + ["should use", "bound there"]
    out += ["| " + " | ".join(head) + " |", "|---|---|---|--:|" + "--:|" * len(PRECISIONS) + "---|---|"]
    for card in cards:
        for preset in presets:
            projs = project_all(card, preset, shape)
            rec = recommend(card, projs, max_score)
            kp = kernel_precision(card, preset)
            cells = []
            for name in PRECISIONS:
                if preset.key_fp8:
                    cells.append(f"**{_cell(projs['fp16'])}**" if name == PRECISIONS[0] else "")
                elif name not in projs:
                    cells.append("n/a")
                else:
                    text = _cell(projs[name]) + ("*" if name == kp else "")
                    text = f"**{text}**" if name == rec else text
                    cells.append(text + ("" if holds_budget(name, max_score) else " x"))
            tiles = projs[kp].tiles + ("" if projs[rec].tiles == projs[kp].tiles else f" ({rec}: {projs[rec].tiles})")
            out.append(
                "| "
                + " | ".join(
                    [f"{card.name} ({card.arch})", preset.name, tiles, str(projs[kp].splits)]
                    + cells
                    + [rec, projs[rec].bound]
                )
                + " |"
            )
    out += [
        "",
        "What kernel changes would give (projected us and bound of the call; analysis, the kernel has "
        "none of them), each column adding to the one before:",
        "",
    ]
    out += [f"- `{name}`: {text}" for name, text in CHANGES.items()]
    out += [
        "",
        "| card | preset | today | should use | + fp16x2 | + word_fields (3-bit) | + pv_fp16_acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for card in cards:
        for preset in presets:
            steps = dict(what_if(card, preset, shape, max_score))
            cells = [_cell(steps.pop("today"))]
            if preset.key_fp8:
                cells += ["same (fp16 scores)", "", "", _cell(steps["pv_fp16_acc"])]
            else:
                labels = list(steps)  # should use, fp16x2, [fp16x2 + word_fields,] all changes
                words = steps.get("fp16x2 + word_fields")
                cells += [
                    f"{_cell(steps[labels[0]])} ({labels[0]})",
                    _cell(steps["fp16x2"]),
                    _cell(words) if words else "",
                    _cell(steps[labels[-1]]),
                ]
            out.append(f"| {card.name} | {preset.name} | " + " | ".join(cells) + " |")
    h100 = CARD["H100 SXM5"]
    out += [
        "",
        "Instruction mix of the split kernel at the H100's tiles and tf32x3: tensor FLOPs (padded rows, all "
        "passes) and ALU lane ops per byte of cache read, dequantization ops per key or value element, HBM "
        "bytes of the call.",
        "",
        "| preset | slot B | tiles | FLOP/B | ALU ops/B | dequant ops/element | HBM MB | "
        "H100 memory / tensor / ALU us |",
        "|---|--:|---|--:|--:|--:|--:|---|",
    ]
    for preset in presets:
        p = project(h100, preset, shape, h100.kernel_precision())
        out.append(
            f"| {preset.name} | {preset.slot_size(shape.head_dim)} | {p.tiles} | "
            f"{p.tensor_flops / p.cache_bytes:.0f} | {p.alu_ops / p.cache_bytes:.1f} | "
            f"{p.dequant_ops_per_element:.1f} | {p.bytes / 1e6:.1f} | "
            + " / ".join(f"{p.terms_us[k]:.1f}" for k in ("memory", "tensor", "alu"))
            + " |"
        )
    if check:
        out += [
            "",
            "H100 check: the current line's kernel (the reports' `new` column, median) against its "
            "projection for the H100 SXM5 at tf32x3; stream: the layout's own read of the same slots "
            "(median) against the cache bytes at datasheet bandwidth.",
            "",
            "| report | preset | D | ctx | B | tiles measured / projected | measured us | projected us | "
            "bound | measured / projected | stream / cache at peak |",
            "|---|---|--:|--:|--:|---|--:|--:|---|--:|--:|",
        ]
        for r in check:
            name = r["report"].removeprefix("bench-tq-mq-roofline-v0.33-h100-").removesuffix(".txt")
            out.append(
                f"| {name} | {r['preset']} | {r['head_dim']} | {r['context']} | {r['batch']} | "
                f"{r['tiles_measured']} / {r['tiles_projected']} | {r['measured_us']:.1f} | "
                f"{r['projected_us']:.1f} | {r['bound']} | {r['ratio']:.1f}x | {r['stream_ratio']:.1f}x |"
            )
        out += [
            "",
            "Measured / projected per preset, every row of both runs: "
            + "; ".join(
                f"{name} {min(v):.1f}x-{max(v):.1f}x (median {statistics.median(v):.1f}x)"
                for name, v in ratios_by_preset(check).items()
            )
            + ". A roofline is a floor: the ratio is the "
            "kernel's inefficiency against its own work.",
        ]
    out += [
        "",
        "Peak rates (dense; FP16/BF16 tensor with FP32 accumulation; TFLOPS, GB/s):",
        "",
        "| card | arch | SMs | boost MHz | GB/s | FP32 | FP16/BF16 tensor | TF32 tensor | FP32 matrix | "
        "shared/block B | source |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for c in cards:
        out.append(
            f"| {c.name} | {c.arch} | {c.sms} | {c.clock_mhz:g} | {c.bandwidth_gbs:g} | {c.fp32_tflops:g} | "
            f"{c.fp16_tflops:g} | {c.tf32_tflops:g} | {c.fp32_matrix_tflops or '-'} | {c.max_shared} | "
            f"{c.source} |"
        )
    return "\n".join(out)


def as_json(shape: Shape, cards: list[Card], presets: list[Preset], max_score: float, check: list[dict]) -> dict:
    out: dict = {
        "shape": asdict(shape),
        "max_score": max_score,
        "lse_tolerance": LSE_TOLERANCE,
        "precisions": {n: asdict(p) for n, p in PRECISION.items()},
        "changes": CHANGES,
        "cards": [asdict(c) for c in cards],
        "projections": [],
        "what_if": [],
        "h100_check": check,
    }
    for card in cards:
        for preset in presets:
            projs = project_all(card, preset, shape)
            rec = recommend(card, projs, max_score)
            for prec, p in projs.items():
                row = asdict(p)
                row.update(
                    score_precision=prec,
                    kernel_precision=prec == kernel_precision(card, preset),
                    holds_budget=prec == "fp16" or holds_budget(prec, max_score),
                    recommended=prec == rec,
                )
                out["projections"].append(row)
            for label, p in what_if(card, preset, shape, max_score):
                out["what_if"].append(dict(asdict(p), step=label))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dim", type=int, default=Shape.head_dim)
    parser.add_argument("--heads", default=f"{Shape.q_heads}/{Shape.kv_heads}", help="query/KV heads")
    parser.add_argument("--k1", type=int, default=Shape.k1, help="queries per request (K+1)")
    parser.add_argument("--batch", type=int, default=Shape.batch)
    parser.add_argument("--context", type=int, default=Shape.context)
    parser.add_argument("--block-size", type=int, default=Shape.block_size)
    parser.add_argument("--max-splits", type=int, default=Shape.max_splits)
    parser.add_argument(
        "--max-score", type=float, default=30.0, help="largest scaled score the precision budget must hold (default 30)"
    )
    parser.add_argument("--cards", default=",".join(CARD), help="comma-separated card names")
    parser.add_argument("--presets", default=",".join(PRESET))
    parser.add_argument(
        "--reports",
        type=Path,
        nargs="*",
        default=list(H100_REPORTS),
        help="bench_tq_mq_roofline.py reports of the H100 to check against",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args(argv)
    hq, hk = (int(x) for x in args.heads.split("/"))
    shape = Shape(args.head_dim, hq, hk, args.k1, args.batch, args.context, args.block_size, args.max_splits)
    cards = [CARD[name] for name in args.cards.split(",")]
    presets = [PRESET[name] for name in args.presets.split(",")]
    check = h100_check(tuple(args.reports))
    if args.json:
        print(json.dumps(as_json(shape, cards, presets, args.max_score, check), indent=1))
    else:
        print(markdown(shape, cards, presets, args.max_score, check))
    return 0


if __name__ == "__main__":
    sys.exit(main())
