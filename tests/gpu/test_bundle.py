from __future__ import annotations

from bundle import kept, split


def test_slimming_drops_fa3_and_deep_gemm_only():
    assert not kept("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
    assert not kept("vllm/third_party/deep_gemm/include/cute/arch/mma_sm90.hpp")
    assert kept("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert kept("vllm/v1/attention/backends/turboquant_attn.py")
    assert kept("vllm-0.20.0.dist-info/RECORD")


def test_split_parts_reassemble(tmp_path):
    data = bytes(range(256)) * 41
    src = tmp_path / "a.tar.xz"
    src.write_bytes(data)
    parts = split(src, tmp_path / "out", part_bytes=4000)
    assert [p.parent.name for p in parts] == ["p1", "p2", "p3"]
    assert b"".join(p.read_bytes() for p in parts) == data
