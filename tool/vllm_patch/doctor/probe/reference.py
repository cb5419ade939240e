"""A TurboQuant cache in a verify geometry and the float64 attention it must give.

The same math as the project's kernel tests (``tests/support/references.py``), which the tool cannot import:
a paged cache packed here byte by byte from random K/V, the K/V dequantized back from those bytes, and the
causal attention of K+1 verify queries over them in float64. The kernel and the reference share the
quantization, so the comparison checks the attention math alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# name: (key bits (8 = FP8 keys), value bits, norm correction), as vLLM's TurboQuant presets.
PRESETS: dict[str, tuple[int, int, bool]] = {
    "k8v4": (8, 4, False),
    "4bit_nc": (4, 4, True),
    "k3v4_nc": (3, 4, True),
    "3bit_nc": (3, 3, True),
}


@dataclass(frozen=True)
class Layout:
    """One slot (one token, one KV head): ``[key | value | scale, zero]``, padded to an even size. Key:
    FP8 (``head_dim`` bytes), or the packed indices of the rotated unit key then its fp16 norm."""

    preset: str
    head_dim: int
    key_bits: int
    value_bits: int
    norm_correction: bool

    @classmethod
    def of(cls, preset: str, head_dim: int) -> Layout:
        key_bits, value_bits, nc = PRESETS[preset]
        return cls(preset, head_dim, key_bits, value_bits, nc)

    @property
    def key_fp8(self) -> bool:
        return self.key_bits == 8

    @property
    def mse_bits(self) -> int:
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
        return self.value_bits if self.key_fp8 else self.key_bits


def hadamard(d: int, device) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix of order ``d`` (a power of two), float32; symmetric."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).to(device=device, dtype=torch.float32)


def gaussian_centroids(d: int, bits: int) -> torch.Tensor:
    """2**bits sorted centroids for N(0, 1/d) coordinates (quantiles at bin centres)."""
    n = 2**bits
    p = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    return (torch.special.ndtri(p) / math.sqrt(d)).to(torch.float32)


def pack_bits(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """(..., n) indices of ``bits`` bits into bytes, LSB first: index j at bit j*bits."""
    shifts = torch.arange(bits, device=idx.device)
    stream = ((idx.long()[..., None] >> shifts) & 1).flatten(-2)
    stream = torch.nn.functional.pad(stream, (0, (-stream.shape[-1]) % 8))
    return (stream.unflatten(-1, (-1, 8)) << torch.arange(8, device=idx.device)).sum(-1).to(torch.uint8)


def unpack_bits(data: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    stream = ((data.long()[..., None] >> torch.arange(8, device=data.device)) & 1).flatten(-2)
    stream = stream[..., : n * bits].unflatten(-1, (n, bits))
    return (stream << torch.arange(bits, device=data.device)).sum(-1)


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(*x.shape, 2)


def _fp16_from(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _fp8_encode(k: torch.Tensor, e4b15: bool) -> torch.Tensor:
    # e4b15 (exponent bias 15, below SM 8.9) has the bit pattern of e4m3fn at 2**8 times the value.
    return (k.float() * 256.0 if e4b15 else k.float()).to(torch.float8_e4m3fn).view(torch.uint8)


def _fp8_decode(b: torch.Tensor, e4b15: bool) -> torch.Tensor:
    v = b.contiguous().view(torch.float8_e4m3fn).float()
    return v / 256.0 if e4b15 else v


def quantize(key: torch.Tensor, value: torch.Tensor, lay: Layout, centroids: torch.Tensor, pi: torch.Tensor,
             e4b15: bool) -> torch.Tensor:
    """(N, D) keys and values into (N, slot_size) bytes, as vLLM's store kernel packs them."""
    n, d = key.shape
    slot = torch.zeros(n, lay.slot_size, dtype=torch.uint8, device=key.device)
    k = key.float()
    if lay.key_fp8:
        slot[:, :d] = _fp8_encode(k, e4b15)
    else:
        norms = k.norm(dim=1, keepdim=True)
        y = (k / (norms + 1e-8)) @ pi
        c = centroids.sort().values
        idx = torch.bucketize(y, (c[:-1] + c[1:]) / 2, right=True).clamp_max(c.numel() - 1)
        slot[:, : lay.mse_bytes] = pack_bits(idx, lay.key_bits)
        slot[:, lay.mse_bytes: lay.mse_bytes + 2] = _fp16_bytes(norms[:, 0])
    v = value.float()
    vmin, vmax = v.min(dim=1).values, v.max(dim=1).values
    levels = 2**lay.value_bits - 1
    scale = ((vmax - vmin) / levels).clamp_min(1e-8)
    q = ((v - vmin[:, None]) / scale[:, None] + 0.5).floor().clamp(0, levels)
    base = lay.key_packed_size
    slot[:, base: base + lay.value_data_bytes] = pack_bits(q.long(), lay.value_bits)
    base += lay.value_data_bytes
    slot[:, base: base + 2] = _fp16_bytes(scale)
    slot[:, base + 2: base + 4] = _fp16_bytes(vmin)
    return slot


def dequantize(slot: torch.Tensor, lay: Layout, centroids: torch.Tensor, pi: torch.Tensor,
               e4b15: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, slot) bytes back to float32 (N, D) keys (original basis) and values."""
    d = lay.head_dim
    if lay.key_fp8:
        k = _fp8_decode(slot[:, :d], e4b15)
    else:
        c = centroids[unpack_bits(slot[:, : lay.mse_bytes], lay.key_bits, d)]
        if lay.norm_correction:
            c = c / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16)
        norm = _fp16_from(slot[:, lay.mse_bytes: lay.mse_bytes + 2])
        k = ((norm[:, None] * c).double() @ pi.double()).float()
    base = lay.key_packed_size
    q = unpack_bits(slot[:, base: base + lay.value_data_bytes], lay.value_bits, d).float()
    base += lay.value_data_bytes
    return k, q * _fp16_from(slot[:, base: base + 2])[:, None] + _fp16_from(slot[:, base + 2: base + 4])[:, None]


@dataclass
class Cache:
    """A filled paged cache as vLLM 0.33 stores it, (blocks, Hk, block_size, slot), and what the reference
    needs: the K/V dequantized from its bytes, per request."""

    layout: Layout
    storage: torch.Tensor  # (blocks, Hk, block_size, slot_aligned) uint8
    block_table: torch.Tensor  # (B, max_blocks) int32
    seq_lens: torch.Tensor  # (B,) int32
    pi: torch.Tensor
    centroids: torch.Tensor
    keys: list[torch.Tensor]  # per request (L, Hk, D) float32
    values: list[torch.Tensor]

    @property
    def kv_cache(self) -> torch.Tensor:
        """The view the backend hands the kernels: ``storage.transpose(1, 2)``."""
        return self.storage.transpose(1, 2)


def build_cache(preset: str, seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int,
                device, e4b15: bool, seed: int = 0, fill: bool = True) -> Cache:
    """A cache of random K/V for requests of these lengths in scattered blocks (every byte not written is
    random, so a kernel reading past a request's end reads garbage). ``fill=False``: random bytes only (for
    timing), no reference K/V."""
    lay = Layout.of(preset, head_dim)
    gen = torch.Generator().manual_seed(seed)
    centroids = gaussian_centroids(head_dim, lay.centroid_bits).to(device)
    pi = hadamard(head_dim, device)
    per_req = [max(1, math.ceil(n / block_size)) for n in seq_lens]
    num_blocks = sum(per_req) + 2
    order = torch.randperm(num_blocks, generator=gen)
    block_table = torch.zeros(len(seq_lens), max(per_req), dtype=torch.int32)
    used = 0
    for b, nb in enumerate(per_req):
        block_table[b, :nb] = order[used: used + nb].to(torch.int32)
        used += nb
    shape = (num_blocks, num_kv_heads, block_size, lay.slot_size_aligned)
    if fill:
        storage = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).to(device)
    else:
        storage = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    block_table = block_table.to(device)
    cache = Cache(lay, storage, block_table, torch.tensor(seq_lens, dtype=torch.int32, device=device), pi,
                  centroids, [], [])
    if not fill:
        return cache
    for b, n in enumerate(seq_lens):
        if n == 0:  # a padding request
            cache.keys.append(torch.zeros(0, num_kv_heads, head_dim, device=device))
            cache.values.append(torch.zeros(0, num_kv_heads, head_dim, device=device))
            continue
        k = (torch.randn(n, num_kv_heads, head_dim, generator=gen) * 0.5).half().to(device)
        v = torch.randn(n, num_kv_heads, head_dim, generator=gen).half().to(device)
        pos = torch.arange(n, device=device)
        blocks = block_table[b, pos // block_size].long()
        packed = quantize(k.flatten(0, 1), v.flatten(0, 1), lay, centroids, pi, e4b15).view(n, num_kv_heads, -1)
        cache.storage[blocks[:, None], torch.arange(num_kv_heads, device=device)[None, :], (pos % block_size)[:, None],
                      : lay.slot_size] = packed
        data = cache.storage[blocks[:, None], torch.arange(num_kv_heads, device=device)[None, :],
                             (pos % block_size)[:, None], : lay.slot_size]
        dk, dv = dequantize(data.flatten(0, 1), lay, centroids, pi, e4b15)
        cache.keys.append(dk.view(n, num_kv_heads, head_dim))
        cache.values.append(dv.view(n, num_kv_heads, head_dim))
    return cache


def verify_rows(seq_lens: list[int], k1: int) -> list[int]:
    """Row ``r*k1+i`` of a verify batch sees ``L_r-k1+1+i`` tokens (0 when that is not positive)."""
    return [max(n - k1 + 1 + i, 0) for n in seq_lens for i in range(k1)]


def verify_reference(query: torch.Tensor, cache: Cache, k1: int, scale: float) -> torch.Tensor:
    """Causal attention of the k1 verify queries of each request over its dequantized K/V, in float64:
    float64 (B*k1, Hq, D), rows without a visible token 0."""
    n_rows, hq, d = query.shape
    lens = verify_rows([int(x) for x in cache.seq_lens.tolist()], k1)
    out = torch.zeros(n_rows, hq, d, dtype=torch.float64, device=query.device)
    for i, n in enumerate(lens):
        if n <= 0:
            continue
        k = cache.keys[i // k1][:n].double()
        v = cache.values[i // k1][:n].double()
        group = hq // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        weights = (torch.einsum("hd,nhd->hn", query[i].double(), k) * scale).softmax(-1)
        out[i] = torch.einsum("hn,nhd->hd", weights, v)
    return out
