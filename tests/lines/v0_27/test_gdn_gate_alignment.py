"""Line v0.27's patch 0005: in a batch that mixes verify rows with rows without drafts, every row of the Qwen GDN
layer runs with its own tokens' gates (a, b).

``QwenGatedDeltaNetAttention._forward_core`` is the tree's own code, cut out of
``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`` with ``ast`` (the file cannot be imported
without vLLM's compiled parts) and run on a stand-in layer whose kernels do what the real ones do with the gates:
``fused_sigmoid_gating_delta_rule_update`` reads token t of sequence n at ``cu_seqlens[n] + t`` of the ``a``
and ``b`` it is given (third_party/flash_linear_attention/ops/fused_sigmoid_gating.py) and here writes those
gates as that token's output; the convolution passes its input through. The layer's merged output then says,
per token, which gates its row ran with."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

GDN = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
CLASS, METHOD = "QwenGatedDeltaNetAttention", "_forward_core"
PREFIX = "model.layers.0.linear_attn"
H = 2  # value heads


class GDNAttentionMetadata(SimpleNamespace):
    pass


def _forward_core(tree: Path):
    path = tree / GDN
    source = ast.parse(path.read_text(), str(path))
    cls = next(n for n in ast.walk(source) if isinstance(n, ast.ClassDef) and n.name == CLASS)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD)
    return fn, compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec")


def _gating_kernel(*, a, b, q, cu_seqlens, **_):
    """Token t of sequence n reads its gates at cu_seqlens[n] + t (bos + t in the kernel) and outputs them."""
    assert q.shape[0] == 1  # (1, tokens, ...)
    out = torch.full((1, q.shape[1], H, 2), float("nan"))
    for n in range(cu_seqlens.numel() - 1):
        for t in range(int(cu_seqlens[n]), int(cu_seqlens[n + 1])):
            out[0, t, :, 0], out[0, t, :, 1] = a[t], b[t]
    return out, None


def _unused(*a, **k):
    raise AssertionError("not expected for a batch without prompt chunks")


def _run(tree: Path, meta: GDNAttentionMetadata, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    fn, code = _forward_core(tree)
    scope: dict[str, Any] = {
        "torch": torch,
        "GDNAttentionMetadata": GDNAttentionMetadata,
        "get_forward_context": lambda: SimpleNamespace(attn_metadata={PREFIX: meta}),
        "is_conv_state_dim_first": lambda: True,
        "causal_conv1d_update": lambda x, *args, **kw: x,
        "causal_conv1d_fn": _unused,
        "fused_post_conv_prep": _unused,
        "fused_sigmoid_gating_delta_rule_update": _gating_kernel,
    }
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for name in names - set(scope) - set(dir(builtins)) - {"self"}:
        scope.setdefault(name, _unused)  # any other module name the method reaches must not be called here
    exec(code, scope)
    n = a.shape[0]
    layer = SimpleNamespace(
        prefix=PREFIX, enable_packed_recurrent_decode=False, kv_cache=(torch.zeros(4, 8, 3), torch.zeros(4, H)),
        conv1d=SimpleNamespace(weight=torch.zeros(8, 1, 4), bias=None), activation="silu", A_log=None,
        dt_bias=None, chunk_gated_delta_rule=_unused,
        rearrange_mixed_qkv=lambda x: (None, None, None) if x is None else (x.unsqueeze(0),) * 3)
    out = torch.full((n, H, 2), float("nan"))
    scope[METHOD](layer, torch.arange(n, dtype=torch.float32)[:, None].expand(n, 8), b, a, out)
    return out


def _mixed_batch(rows: list[tuple[int, bool]]) -> tuple[GDNAttentionMetadata, int]:
    """Decode rows of (tokens, spec?) in batch order, as gdn_attn.py's builder lays out a batch without prompt
    chunks: spec tokens gathered by spec_token_indx, the rest by non_spec_token_indx, each part's cu_seqlens
    counted over its own tokens."""
    spec_idx, non_spec_idx, spec_qsl, non_spec_qsl, t = [], [], [0], [0], 0
    for q_len, spec in rows:
        (spec_idx if spec else non_spec_idx).extend(range(t, t + q_len))
        qsl = spec_qsl if spec else non_spec_qsl
        qsl.append(qsl[-1] + q_len)
        t += q_len
    num_spec = sum(s for _, s in rows)
    i32 = dict(dtype=torch.int32)
    meta = GDNAttentionMetadata(
        num_prefills=0, num_decodes=len(rows) - num_spec, num_decode_tokens=len(non_spec_idx),
        num_spec_decodes=num_spec, num_actual_tokens=t, has_initial_state=None,
        spec_sequence_masks=torch.tensor([s for _, s in rows]),
        spec_token_indx=torch.tensor(spec_idx), non_spec_token_indx=torch.tensor(non_spec_idx),  # argsort: int64
        spec_query_start_loc=torch.tensor(spec_qsl, **i32), non_spec_query_start_loc=torch.tensor(non_spec_qsl, **i32),
        spec_state_indices_tensor=torch.zeros(num_spec, 3, **i32),
        non_spec_state_indices_tensor=torch.zeros(len(rows) - num_spec, **i32),
        num_accepted_tokens=torch.ones(num_spec, **i32), prefill_state_indices=None,
        prefill_has_initial_state=None)
    return meta, t


@pytest.mark.parametrize("rows", [
    [(1, False), (3, True), (1, False)],  # a decode without drafts first, as V1 may order them
    [(3, True), (1, False), (3, True)],  # verify rows first
], ids=["no-draft-first", "verify-first"])
def test_each_row_runs_with_its_own_gates(v027_tree, rows):
    """K = 2: verify rows of 3 tokens beside decodes without drafts (non-spec rows on 0.27.1's V1 runner)."""
    meta, n = _mixed_batch(rows)
    a = torch.arange(n, dtype=torch.float32)[:, None] + torch.tensor([0.0, 0.5])  # token t: t, t + 0.5
    b = -a
    out = _run(v027_tree, meta, a, b)
    want = torch.stack([a, b], dim=-1)
    wrong = [t for t in range(n) if not torch.equal(out[t], want[t])]
    assert not wrong, (f"tokens {wrong} of {n} (rows {rows}: (tokens, spec)) ran with other tokens' gates: "
                       f"a seen {out[:, 0, 0].tolist()}, own {a[:, 0].tolist()}")
