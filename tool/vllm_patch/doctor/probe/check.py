"""The installed multi-query verify kernel checked on a random quantized cache, against a float64 reference
of that cache and against the release's own route (its decode kernel, one row per verify query, each over
its causal length), and both timed.

Each preset: requests shorter than K+1 (a row that sees nothing must be 0), across pages, a padding request
(length 0); the tiles the route took. Timing: 8k and 32k tokens of context, batch 1 and 8, CUDA events,
warm-up then ``RUNS`` runs, the median; the ratio is the release's time over the kernel's (above 1: the
line's kernel is faster).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from types import ModuleType

import torch

from .reference import Layout, build_cache, verify_reference, verify_rows

# The kernel rounds softmax weight x value scale to float16: the tolerance of the project's kernel tests.
ATOL, RTOL = 3e-3, 1e-2
WARMUP, RUNS = 3, 7
CONTEXTS = (8192, 32768)
BATCHES = (1, 8)
# The split limit vLLM passes (attention_config.tq_max_kv_splits_for_cuda_graph).
MAX_SPLITS = 32


def _e4b15(decode: ModuleType, device: torch.device) -> bool:
    return device.type == "cuda" and bool(decode._use_fp8_e4b15(device.index or 0))


def _mq(kernel: ModuleType, cache, query: torch.Tensor, k1: int, tiles, splits: int | None = None):
    """The kernel into NaN-filled buffers, as the backend calls it; returns a launcher and the output."""
    n, hq, d = query.shape
    lay = cache.layout
    out = torch.full((n, hq, d), float("nan"), dtype=query.dtype, device=query.device)
    cuda = query.device.type == "cuda"
    mid = torch.empty((n, hq, MAX_SPLITS if cuda else 1, d + 1), dtype=torch.float32, device=query.device)
    q_rot = torch.empty((n, hq, d), dtype=torch.float32, device=query.device)

    def launch():
        return kernel.triton_turboquant_mq_verify_attention(
            query, cache.kv_cache, cache.block_table, cache.seq_lens, k1, cache.centroids, 1 / math.sqrt(d),
            lay.mse_bits, lay.key_packed_size, lay.value_bits, out, mid, q_rot, PiT=cache.pi, key_fp8=lay.key_fp8,
            norm_correction=lay.norm_correction, max_num_kv_splits=MAX_SPLITS if cuda else 1,
            num_kv_splits=splits, tiles=tiles)
    return launch, out


def _release(decode: ModuleType, cache, query: torch.Tensor, k1: int):
    """The release's decode kernel on the B*K1 rows, row (r, i) over the first L_r-K1+1+i tokens."""
    n, hq, d = query.shape
    b = n // k1
    lay = cache.layout
    offs = torch.arange(1 - k1, 1, dtype=torch.int32, device=query.device)
    lens = (cache.seq_lens[:b, None] + offs).clamp_min(0).reshape(-1).to(torch.int32)
    table = cache.block_table[:b].repeat_interleave(k1, dim=0)
    splits = MAX_SPLITS if query.device.type == "cuda" else 1
    mid = torch.empty((n, hq, splits, d + 1), dtype=torch.float32, device=query.device)
    out = torch.empty((n, hq, d), dtype=query.dtype, device=query.device)
    lse = torch.empty((n, hq), dtype=torch.float32, device=query.device)

    def launch():
        return decode.triton_turboquant_decode_attention(
            query, cache.kv_cache, table, lens, Pi=cache.pi, centroids=cache.centroids, scale=1 / math.sqrt(d),
            mse_bits=lay.mse_bits, key_packed_size=lay.key_packed_size, value_quant_bits=lay.value_bits,
            key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, PiT=cache.pi, mid_o_buf=mid,
            output_buf=out, lse_buf=lse, max_num_kv_splits=splits)
    return launch


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _compare(got: torch.Tensor, want: torch.Tensor, live: torch.Tensor) -> tuple[float, bool]:
    """(max abs error over the rows that see tokens, within ATOL + RTOL x |want| everywhere there)."""
    if not bool(live.any()):
        return 0.0, True
    g, w = got[live].double(), want[live].double()
    diff = (g - w).abs()
    bad = ~(diff <= ATOL + RTOL * w.abs())  # NaN counts as bad
    return float(diff.nan_to_num(float("inf")).max()), not bool(bad.any())


def lengths(k1: int, block_size: int, cuda: bool) -> list[int]:
    """Requests of the check: shorter than K+1, a few tokens past one and two pages, (on a GPU) a long one,
    a padding request. No length is a whole number of pages."""
    lens = [k1 - 1, block_size + 3, 2 * block_size + 5]
    if cuda:
        lens.append(40 * block_size + 7)
    return [*lens, 0]


def check_preset(kernel: ModuleType, decode: ModuleType, preset: str, heads: tuple[int, int, int], k1: int,
                 tiles, device: torch.device, block_size: int, seed: int = 0) -> dict:
    """The kernel (when `tiles`, the route's) and the release's decode route against the reference."""
    hq, hk, d = heads
    lens = lengths(k1, block_size, device.type == "cuda")
    cache = build_cache(preset, lens, hk, d, block_size, device, _e4b15(decode, device), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    query = torch.randn(len(lens) * k1, hq, d, generator=gen).half().to(device)
    want = verify_reference(query, cache, k1, 1 / math.sqrt(d))
    live = torch.tensor(verify_rows(lens, k1), device=device) > 0
    result = {"preset": preset, "k1": k1, "lengths": lens, "atol": ATOL, "rtol": RTOL}
    release = _release(decode, cache, query, k1)()
    result["release_error"], release_ok = _compare(release, want, live)
    result["release_ok"] = release_ok
    if tiles is None:
        result.update(kernel_error=None, kernel_ok=None, agrees_with_release=None, zero_rows_ok=None,
                      ok=release_ok)
        return result
    # On a GPU, the split count of a batch-1 launch (the timing's first), so both share one compile.
    splits = kernel.tq_mq_verify_num_splits(hk * tiles.m_tiles, _sms(device), MAX_SPLITS) \
        if device.type == "cuda" else None
    launch, out = _mq(kernel, cache, query, k1, tiles, splits)
    launch()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    result["kernel_error"], kernel_ok = _compare(out, want, live)
    result["release_difference"], agrees = _compare(out, release, live)
    zero_rows_ok = not bool(out[~live].ne(0).any())
    result.update(kernel_ok=kernel_ok, agrees_with_release=agrees, zero_rows_ok=zero_rows_ok,
                  ok=kernel_ok and agrees and zero_rows_ok and release_ok)
    return result


def warm_up(kernel: ModuleType, decode: ModuleType, preset: str, heads: tuple[int, int, int], k1: int, tiles,
            device: torch.device, block_size: int) -> None:
    """One launch of each route in the shapes the timing takes beyond the check's (batch 8), on a small
    cache: their compiles happen here, where they can overlap other presets' work, not while timing."""
    hq, hk, d = heads
    batch = max(BATCHES)
    cache = build_cache(preset, [2 * block_size + 1] * batch, hk, d, block_size, device, False, fill=False)
    query = torch.zeros(batch * k1, hq, d, dtype=torch.float16, device=device)
    _mq(kernel, cache, query, k1, tiles)[0]()
    _release(decode, cache, query, k1)()
    torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object]) -> float:
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_preset(kernel: ModuleType, decode: ModuleType, preset: str, heads: tuple[int, int, int], k1: int,
                tiles, device: torch.device, block_size: int,
                progress: Callable[[str], None] = lambda text: None) -> list[dict]:
    """Median times (microseconds) of the kernel and the release's route, and their ratio, per cell."""
    hq, hk, d = heads
    cells = []
    cache = build_cache(preset, [max(CONTEXTS)] * max(BATCHES), hk, d, block_size, device, False, fill=False)
    gen = torch.Generator().manual_seed(7)
    lay = Layout.of(preset, d)
    for context in CONTEXTS:
        for batch in BATCHES:
            progress(f"timing {preset}: {context // 1024}k context, batch {batch}")
            view = type(cache)(lay, cache.storage, cache.block_table[:batch],
                               torch.full((batch,), context, dtype=torch.int32, device=device), cache.pi,
                               cache.centroids, [], [])
            query = torch.randn(batch * k1, hq, d, generator=gen).half().to(device)
            mq_ms = _median_ms(_mq(kernel, view, query, k1, tiles)[0])
            release_ms = _median_ms(_release(decode, view, query, k1))
            cells.append({"context": context, "batch": batch, "kernel_us": round(mq_ms * 1000, 1),
                          "release_us": round(release_ms * 1000, 1), "ratio": round(release_ms / mq_ms, 2)})
    del cache
    torch.cuda.empty_cache()
    return cells
