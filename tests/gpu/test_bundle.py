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


def test_a_part_and_the_repository_fit_one_call_to_the_gpu_host():
    """A call carries the repository's tracked (and not ignored) files beside what it names: a part with its
    manifest must fit beside them, with room for a few more reports, or each part takes two calls."""
    import subprocess
    from pathlib import Path

    from bundle import CALL_BYTES, PART_BYTES

    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((root / name.decode()).stat().st_size for name in listed if name and (root / name.decode()).is_file())
    manifest = 64 * 2**10
    assert tree > 2**20  # the listing itself works
    assert PART_BYTES + manifest + tree + 2 * 2**20 <= CALL_BYTES, f"the tree is {tree / 2**20:.1f} MiB"
