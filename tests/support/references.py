"""PyTorch references for the vLLM Triton kernels under test, and builders of their inputs.

Written from the kernels' documented semantics, in float64 where it is cheap, so a test compares
a kernel with an independent computation and never with itself.

- Causal conv1d (Mamba/GDN): ``causal_conv1d_varlen_ref`` (prefill over a varlen batch, the
  conv state read and written through cache indices) and ``causal_conv1d_update_ref`` (decode, plain
  or speculative, the state as a sliding window of accepted tokens).
- TurboQuant KV cache: ``TQLayout`` (the slot layout), ``build_tq_cache`` (a paged cache, packed
  here byte by byte or by a given store kernel, with its block table and the dequantized K/V), and
  ``tq_attention_ref`` (masked softmax attention of query rows over that K/V).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

# ---------------------------------------------------------------------------
# Causal conv1d
# ---------------------------------------------------------------------------


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation in ("silu", "swish"):
        return y * torch.sigmoid(y)
    if activation is None:
        return y
    raise ValueError(f"unknown activation {activation!r}")


def _conv_window(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 activation: str | None, n_out: int) -> torch.Tensor:
    """Outputs for the last ``n_out`` columns of ``window`` (dim, W-1+n_out):
    ``y[:, t] = act(b + sum_j w[:, j] * window[:, t + j])``."""
    width = weight.shape[1]
    w = weight.double()
    cols = window.double().unfold(1, width, 1)  # (dim, n_out, width)
    assert cols.shape[1] == n_out
    y = (cols * w[:, None, :]).sum(-1)
    if bias is not None:
        y = y + bias.double()[:, None]
    return _act(y, activation)


def causal_conv1d_varlen_ref(
    x: torch.Tensor,  # (dim, total_tokens)
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,  # (lines, dim, state_len >= width - 1)
    query_start_loc: torch.Tensor,  # (batch + 1,)
    cache_indices: torch.Tensor,  # (batch,)
    has_initial_state: torch.Tensor,  # (batch,) bool
    activation: str | None,
    null_block_id: int | None = 0,
) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
    """Prefill of a varlen batch: (out float64 (dim, total_tokens), new conv states, rows processed).

    Sequence i reads its line ``conv_states[cache_indices[i]]`` (only the first width-1 columns are
    the state) as the tokens before its first one when ``has_initial_state[i]``, zeros otherwise, and
    leaves there the last width-1 inputs (state included when the sequence is shorter). A row whose
    line is ``null_block_id`` is skipped: its outputs are undefined and no state changes.
    """
    width = weight.shape[1]
    keep = width - 1
    states = conv_states.clone()
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    starts = query_start_loc.tolist()
    done = []
    for i, line in enumerate(cache_indices.tolist()):
        s, e = starts[i], starts[i + 1]
        if null_block_id is not None and line == null_block_id:
            done.append(False)
            continue
        done.append(True)
        if e == s:
            continue
        prefix = conv_states[line, :, :keep].double() if bool(has_initial_state[i]) else \
            torch.zeros(x.shape[0], keep, dtype=torch.float64, device=x.device)
        window = torch.cat([prefix, x[:, s:e].double()], dim=1)
        out[:, s:e] = _conv_window(window, weight, bias, activation, e - s)
        states[line, :, :keep] = window[:, -keep:].to(states.dtype)
    return out, states, done


def causal_conv1d_update_ref(
    x: torch.Tensor,  # (batch, dim, seqlen) or, with query_start_loc, (total_tokens, dim)
    conv_state: torch.Tensor,  # (lines, dim, state_len)
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,
    activation: str | None,
    conv_state_indices: torch.Tensor,  # (batch,)
    num_accepted_tokens: torch.Tensor | None = None,  # (batch,)
    query_start_loc: torch.Tensor | None = None,  # (batch + 1,)
    null_block_id: int | None = 0,
) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
    """Decode step: (out float64 shaped like ``x``, new conv states, rows processed).

    Without ``num_accepted_tokens`` the window is the state's first width-1 columns followed by the
    new tokens, and the state becomes the window's last width-1 columns.

    With it (speculative decoding) the state holds ``[history..., drafts...]`` from the previous step;
    after ``a`` accepted tokens the window starts at column ``a - 1``: it is ``state[a-1 : a-1+width-1]``
    followed by the new tokens, and the state becomes ``state[a : a-1+width-1]`` followed by the new
    tokens (width - 2 + seqlen columns), so that the next step can again start at its own offset.
    Rows whose line is ``null_block_id`` (or with no tokens) are skipped.
    """
    width = weight.shape[1]
    keep = width - 1
    states = conv_state.clone()
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    batch = conv_state_indices.shape[0]
    done = []
    for i in range(batch):
        line = int(conv_state_indices[i])
        if query_start_loc is not None:
            s, e = int(query_start_loc[i]), int(query_start_loc[i + 1])
            xi = x[s:e].T  # (dim, seqlen)
        else:
            xi = x[i]
        if (null_block_id is not None and line == null_block_id) or xi.shape[1] == 0:
            done.append(False)
            continue
        done.append(True)
        off = int(num_accepted_tokens[i]) - 1 if num_accepted_tokens is not None else 0
        cs = conv_state[line].double()
        window = torch.cat([cs[:, off:off + keep], xi.double()], dim=1)
        yi = _conv_window(window, weight, bias, activation, xi.shape[1])
        if query_start_loc is not None:
            out[s:e] = yi.T
        else:
            out[i] = yi
        new = window[:, 1:] if num_accepted_tokens is not None else window[:, -keep:]
        states[line, :, :new.shape[1]] = new.to(states.dtype)
    return out, states, done


# ---------------------------------------------------------------------------
# TurboQuant KV cache
# ---------------------------------------------------------------------------

TQ_PRESETS: dict[str, tuple[int, int, bool]] = {
    # name: (key bits (8 = FP8 keys), value bits, norm correction)
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}


@dataclass(frozen=True)
class TQLayout:
    """One slot (one token, one KV head) of a TurboQuant cache: ``[key | value | pad]``.

    Key: FP8 (``head_dim`` bytes), or MSE: the Lloyd-Max indices of the Hadamard-rotated unit key,
    packed LSB first (``ceil(D * bits / 8)`` bytes), then the key's norm as fp16. Value: its
    uniform-quantized indices packed LSB first, then fp16 scale and fp16 zero (the minimum). The slot
    is padded to an even size.
    """

    preset: str
    head_dim: int
    key_bits: int
    value_bits: int
    norm_correction: bool

    @classmethod
    def from_preset(cls, preset: str, head_dim: int) -> TQLayout:
        name = preset if preset.startswith("turboquant_") else f"turboquant_{preset}"
        key_bits, value_bits, nc = TQ_PRESETS[name]
        return cls(name, head_dim, key_bits, value_bits, nc)

    @property
    def key_fp8(self) -> bool:
        return self.key_bits == 8

    @property
    def mse_bits(self) -> int:
        """Bits of the key indices, 0 for FP8 keys (what the backend passes as ``mse_bits``)."""
        return 0 if self.key_fp8 else self.key_bits

    @property
    def mse_bytes(self) -> int:
        return math.ceil(self.head_dim * self.mse_bits / 8)

    @property
    def key_packed_size(self) -> int:
        return self.head_dim if self.key_fp8 else self.mse_bytes + 2

    @property
    def value_data_bytes(self) -> int:
        return math.ceil(self.head_dim * self.value_bits / 8)

    @property
    def slot_size(self) -> int:
        return self.key_packed_size + self.value_data_bytes + 4

    @property
    def slot_size_aligned(self) -> int:
        return self.slot_size + self.slot_size % 2

    @property
    def centroid_bits(self) -> int:
        """Bits of the centroid table the backend builds (value bits when keys are FP8)."""
        return self.value_bits if self.key_fp8 else self.key_bits


def hadamard(d: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix of order ``d`` (a power of two), float32; symmetric."""
    if d & (d - 1):
        raise ValueError(f"head_dim must be a power of two, got {d}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).to(device=device, dtype=torch.float32)


def gaussian_centroids(d: int, bits: int) -> torch.Tensor:
    """A sorted table of 2**bits centroids for N(0, 1/d) coordinates (quantiles at bin centres)."""
    n = 2**bits
    p = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    return (torch.special.ndtri(p) / math.sqrt(d)).to(torch.float32)


def pack_bits(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack (..., n) integer indices of ``bits`` bits each into bytes, LSB first: index j at bit j*bits."""
    shifts = torch.arange(bits, device=idx.device)
    stream = ((idx.long()[..., None] >> shifts) & 1).flatten(-2)
    pad = (-stream.shape[-1]) % 8
    stream = torch.nn.functional.pad(stream, (0, pad))
    byte_bits = stream.unflatten(-1, (-1, 8))
    return (byte_bits << torch.arange(8, device=idx.device)).sum(-1).to(torch.uint8)


def unpack_bits(data: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of ``pack_bits``: (..., nbytes) uint8 to (..., n) int64."""
    stream = ((data.long()[..., None] >> torch.arange(8, device=data.device)) & 1).flatten(-2)
    stream = stream[..., : n * bits].unflatten(-1, (n, bits))
    return (stream << torch.arange(bits, device=data.device)).sum(-1)


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(*x.shape, 2)


def _fp16_from(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _fp8_encode(k: torch.Tensor, e4b15: bool) -> torch.Tensor:
    # e4b15 (exponent bias 15, used below SM 8.9) has the bit pattern of e4m3fn at 2**8 times the value.
    scaled = k.float() * 256.0 if e4b15 else k.float()
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8)


def _fp8_decode(b: torch.Tensor, e4b15: bool) -> torch.Tensor:
    v = b.contiguous().view(torch.float8_e4m3fn).float()
    return v / 256.0 if e4b15 else v


def quantize_tq(key: torch.Tensor, value: torch.Tensor, layout: TQLayout, centroids: torch.Tensor,
                pit: torch.Tensor, fp8_e4b15: bool = False) -> torch.Tensor:
    """Quantize (N, D) keys and values into (N, slot_size_aligned) slot bytes, as the store kernel does.

    MSE keys: unit key rotated by ``pit``, each coordinate bucketed at the midpoints of the sorted
    centroid table. Values: indices ``floor((v - min) / s + 1/2)`` with ``s = max((max - min) /
    (2**bits - 1), 1e-8)`` computed in float32.
    """
    n, d = key.shape
    slot = torch.zeros(n, layout.slot_size_aligned, dtype=torch.uint8, device=key.device)
    k = key.float()
    if layout.key_fp8:
        slot[:, :d] = _fp8_encode(k, fp8_e4b15)
    else:
        norms = k.norm(dim=1, keepdim=True)
        y = (k / (norms + 1e-8)) @ pit.float()
        c = centroids.float().sort().values
        mid = (c[:-1] + c[1:]) / 2
        idx = torch.bucketize(y, mid, right=True).clamp_max(c.numel() - 1)
        slot[:, : layout.mse_bytes] = pack_bits(idx, layout.key_bits)
        slot[:, layout.mse_bytes: layout.mse_bytes + 2] = _fp16_bytes(norms[:, 0])
    v = value.float()
    vmin, vmax = v.min(dim=1).values, v.max(dim=1).values
    levels = 2**layout.value_bits - 1
    scale = ((vmax - vmin) / levels).clamp_min(1e-8)
    q = ((v - vmin[:, None]) / scale[:, None] + 0.5).floor().clamp(0, levels)
    base = layout.key_packed_size
    slot[:, base: base + layout.value_data_bytes] = pack_bits(q.long(), layout.value_bits)
    base += layout.value_data_bytes
    slot[:, base: base + 2] = _fp16_bytes(scale)
    slot[:, base + 2: base + 4] = _fp16_bytes(vmin)
    return slot


def dequantize_tq(slot: torch.Tensor, layout: TQLayout, centroids: torch.Tensor, pi: torch.Tensor,
                  fp8_e4b15: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, slot) bytes to float32 (N, D) keys (in the original basis) and values.

    MSE key = norm * c[idx] @ Pi, with c[idx] scaled to unit length first under norm correction.
    Value = idx * scale + zero, both fp16 as stored.
    """
    d = layout.head_dim
    if layout.key_fp8:
        k = _fp8_decode(slot[:, :d], fp8_e4b15)
    else:
        idx = unpack_bits(slot[:, : layout.mse_bytes], layout.key_bits, d)
        c = centroids.float()[idx]
        if layout.norm_correction:
            c = c / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16)
        norm = _fp16_from(slot[:, layout.mse_bytes: layout.mse_bytes + 2])
        k = ((norm[:, None] * c).double() @ pi.double()).float()
    base = layout.key_packed_size
    q = unpack_bits(slot[:, base: base + layout.value_data_bytes], layout.value_bits, d).float()
    base += layout.value_data_bytes
    scale = _fp16_from(slot[:, base: base + 2])
    zero = _fp16_from(slot[:, base + 2: base + 4])
    return k, q * scale[:, None] + zero[:, None]


# A store launcher with the signature of vLLM's ``triton_turboquant_store``.
StoreFn = Callable[..., None]


@dataclass
class TQCache:
    """A filled TurboQuant paged cache for B requests, and what a decode launch and its reference need."""

    layout: TQLayout
    kv_cache: torch.Tensor  # (num_blocks, block_size, Hk, slot_size_aligned) uint8
    block_table: torch.Tensor  # (B, max_blocks) int32; unused entries 0
    seq_lens: torch.Tensor  # (B,) int32
    slot_mapping: torch.Tensor  # (sum L_b,) int32, request-major
    pi: torch.Tensor  # (D, D) float32, the Hadamard rotation (Pi == PiT)
    centroids: torch.Tensor  # (2**centroid_bits,) float32
    midpoints: torch.Tensor  # (2**centroid_bits - 1,) float32
    fp8_e4b15: bool
    raw_keys: list[torch.Tensor] = field(default_factory=list)  # per request (L_b, Hk, D), as stored
    raw_values: list[torch.Tensor] = field(default_factory=list)
    keys: list[torch.Tensor] = field(default_factory=list)  # per request (L_b, Hk, D) float32, dequantized
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def block_size(self) -> int:
        return self.kv_cache.shape[1]

    @property
    def decode_kwargs(self) -> dict:
        """Keyword arguments of ``triton_turboquant_decode_attention`` besides query, cache, table, lengths, scale."""
        lay = self.layout
        return dict(Pi=self.pi, centroids=self.centroids, mse_bits=lay.mse_bits,
                    key_packed_size=lay.key_packed_size, value_quant_bits=lay.value_bits,
                    key_fp8=lay.key_fp8, norm_correction=lay.norm_correction, PiT=self.pi)

    @property
    def store_args(self) -> dict:
        """Keyword arguments of ``triton_turboquant_store`` besides key, value, cache and slot mapping."""
        lay = self.layout
        return dict(PiT=self.pi, midpoints=self.midpoints, mse_bits=lay.mse_bits,
                    key_packed_size=lay.key_packed_size, value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8)

    def read_request(self, b: int) -> torch.Tensor:
        """The stored slot bytes of request ``b``: (L_b, Hk, slot) uint8, through its block table."""
        pos = torch.arange(int(self.seq_lens[b]), device=self.kv_cache.device)
        blocks = self.block_table[b, pos // self.block_size].long()
        return self.kv_cache[blocks, pos % self.block_size]


def build_tq_cache(
    preset: str,
    seq_lens: Sequence[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    device: torch.device | str = "cpu",
    *,
    seed: int = 0,
    centroids: torch.Tensor | None = None,
    store: StoreFn | None = None,
    dtype: torch.dtype = torch.float16,
    extra_blocks: int = 3,
    fp8_e4b15: bool | None = None,
) -> TQCache:
    """A TurboQuant paged cache holding random K/V for requests of lengths ``seq_lens``.

    Each request gets its own blocks, drawn in shuffled order from a pool with ``extra_blocks``
    spare ones, so block tables are scattered and non-monotonic; every byte not written (spare
    blocks, slots past a request's end, the slot padding) is random, so a kernel that reads where it
    should not gets garbage. The cache is packed here (``quantize_tq``), or by ``store`` when given
    (vLLM's ``triton_turboquant_store``). ``keys``/``values`` are dequantized from the cache bytes, so
    a reference built on them shares the quantization with the kernel and checks the attention math.

    ``centroids`` default to ``gaussian_centroids``; ``fp8_e4b15`` defaults to what the kernels pick
    (CUDA below SM 8.9).
    """
    layout = TQLayout.from_preset(preset, head_dim)
    device = torch.device(device)
    if fp8_e4b15 is None:
        fp8_e4b15 = device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9)
    gen = torch.Generator().manual_seed(seed)
    if centroids is None:
        centroids = gaussian_centroids(head_dim, layout.centroid_bits)
    centroids = centroids.to(device=device, dtype=torch.float32)
    c_sorted = centroids.sort().values
    midpoints = (c_sorted[:-1] + c_sorted[1:]) / 2
    pi = hadamard(head_dim, device)

    per_req = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(per_req) + extra_blocks
    order = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(per_req + [1])
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for b, nb in enumerate(per_req):
        block_table[b, :nb] = order[used: used + nb].to(torch.int32)
        used += nb
    kv_cache = torch.randint(0, 256, (num_blocks, block_size, num_kv_heads, layout.slot_size_aligned),
                             generator=gen, dtype=torch.uint8)

    raw_k, raw_v, slots = [], [], []
    for b, n in enumerate(seq_lens):
        raw_k.append((torch.randn(n, num_kv_heads, head_dim, generator=gen) * 0.5).to(dtype))
        raw_v.append(torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype))
        pos = torch.arange(n)
        slots.append(block_table[b, pos // block_size].long() * block_size + pos % block_size)
    slot_mapping = torch.cat(slots).to(torch.int32) if slots else torch.zeros(0, dtype=torch.int32)

    kv_cache = kv_cache.to(device)
    block_table = block_table.to(device)
    slot_mapping = slot_mapping.to(device)
    keys_all = torch.cat(raw_k).to(device)
    values_all = torch.cat(raw_v).to(device)
    if store is not None:
        store(keys_all, values_all, kv_cache, slot_mapping, PiT=pi, midpoints=midpoints, mse_bits=layout.mse_bits,
              key_packed_size=layout.key_packed_size, value_quant_bits=layout.value_bits, key_fp8=layout.key_fp8)
    else:
        flat = kv_cache.view(-1, num_kv_heads, layout.slot_size_aligned)
        packed = quantize_tq(keys_all.flatten(0, 1), values_all.flatten(0, 1), layout, centroids, pi, fp8_e4b15)
        # The padding byte (when the slot size is odd) keeps its random content, as the store leaves it.
        flat[slot_mapping.long(), :, : layout.slot_size] = packed.view(-1, num_kv_heads, packed.shape[-1])[
            ..., : layout.slot_size]

    cache = TQCache(layout, kv_cache, block_table, torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
                    slot_mapping, pi, centroids, midpoints, fp8_e4b15,
                    [k.to(device) for k in raw_k], [v.to(device) for v in raw_v])
    for b in range(len(seq_lens)):
        data = cache.read_request(b)
        k, v = dequantize_tq(data.flatten(0, 1), layout, centroids, pi, fp8_e4b15)
        cache.keys.append(k.view(data.shape[0], num_kv_heads, head_dim))
        cache.values.append(v.view(data.shape[0], num_kv_heads, head_dim))
    return cache


def tq_attention_ref(
    query: torch.Tensor,  # (N, Hq, D)
    keys: Sequence[torch.Tensor],  # per request (L_r, Hk, D)
    values: Sequence[torch.Tensor],
    seq_lens: Sequence[int] | torch.Tensor,  # (N,) positions row i attends to: 0 .. seq_lens[i]-1
    scale: float,
    rows_request: Sequence[int] | torch.Tensor | None = None,  # (N,) request of row i; default row i
) -> torch.Tensor:
    """Softmax attention of each query row over the first ``seq_lens[i]`` K/V positions of its request.

    Query head h reads KV head ``h // (Hq // Hk)``. Float64, returned as float32 (N, Hq, D). A row
    with no position (length 0) gets NaN: the kernel leaves such rows undefined.
    """
    n_rows, hq, d = query.shape
    lens = [int(x) for x in (seq_lens.tolist() if torch.is_tensor(seq_lens) else seq_lens)]
    reqs = list(range(n_rows)) if rows_request is None else \
        [int(x) for x in (rows_request.tolist() if torch.is_tensor(rows_request) else rows_request)]
    out = torch.full((n_rows, hq, d), float("nan"), dtype=torch.float64, device=query.device)
    for i in range(n_rows):
        n = lens[i]
        if n <= 0:
            continue
        k = keys[reqs[i]][:n].double()  # (n, Hk, D)
        v = values[reqs[i]][:n].double()
        assert k.shape[0] == n, f"row {i} wants {n} positions, request {reqs[i]} has {k.shape[0]}"
        group = hq // k.shape[1]
        k = k.repeat_interleave(group, dim=1)  # (n, Hq, D)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", query[i].double(), k) * scale
        out[i] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
    return out.float()


def tq_verify_rows(seq_lens: Sequence[int] | torch.Tensor, k1: int) -> tuple[list[int], list[int]]:
    """The rows of a verify batch: (visible length, request) of row ``r*k1+i``, the length being
    ``L_r-k1+1+i`` clamped at 0 (query i sees the cache up to and including its own token)."""
    lens = [int(x) for x in (seq_lens.tolist() if torch.is_tensor(seq_lens) else seq_lens)]
    rows_len = [max(L - k1 + 1 + i, 0) for L in lens for i in range(k1)]
    rows_req = [r for r in range(len(lens)) for _ in range(k1)]
    return rows_len, rows_req


def tq_verify_ref(
    query: torch.Tensor,  # (B*k1, Hq, D), request-major
    keys: Sequence[torch.Tensor],  # per request (L_r, Hk, D)
    values: Sequence[torch.Tensor],
    seq_lens: Sequence[int] | torch.Tensor,  # (B,) L_r, the k1 new tokens included
    k1: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of k1 verify queries per request, and its natural-log LSE (float64 math).

    Returns float32 (B*k1, Hq, D) outputs, NaN for rows without a visible position (``tq_attention_ref``),
    and float32 (B*k1, Hq) log-sum-exps of the scaled scores, -inf for such rows.
    """
    rows_len, rows_req = tq_verify_rows(seq_lens, k1)
    out = tq_attention_ref(query, keys, values, rows_len, scale, rows_request=rows_req)
    lse = torch.full(query.shape[:2], float("-inf"), dtype=torch.float64, device=query.device)
    for i, (n, r) in enumerate(zip(rows_len, rows_req, strict=True)):
        if n <= 0:
            continue
        k = keys[r][:n].double()
        k = k.repeat_interleave(query.shape[1] // k.shape[1], dim=1)
        lse[i] = (torch.einsum("hd,nhd->hn", query[i].double(), k) * scale).logsumexp(-1)
    return out, lse.float()


def stage_graph_batch(cache: TQCache, query: torch.Tensor, q_buf: torch.Tensor, seq_buf: torch.Tensor,
                      bt_buf: torch.Tensor, kv_buf: torch.Tensor) -> None:
    """Copy a batch into the persistent buffers a captured CUDA graph reads, as vLLM's runner does before a
    replay: the queries, the lengths and block table (0 past the batch: padding requests), the cache pool."""
    b = cache.seq_lens.shape[0]
    q_buf.zero_()
    q_buf[: query.shape[0]] = query
    seq_buf.zero_()
    seq_buf[:b] = cache.seq_lens
    bt_buf.zero_()
    bt_buf[:b, : cache.block_table.shape[1]] = cache.block_table
    kv_buf[: cache.kv_cache.shape[0]] = cache.kv_cache
