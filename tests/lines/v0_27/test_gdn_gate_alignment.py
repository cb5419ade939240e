"""Line v0.27's patch 0005: in a batch that mixes verify rows with plain rows of one token, every row of the Qwen GDN
layer runs with its own tokens' gates (a, b).

The batch is laid out by the tree's own ``GDNAttentionMetadataBuilder.build`` (``gdn_attn.py``; every method of
the tree's builder class bound to a stand-in that holds data only), given what a V1 runner hands it: K = 2 draft
counts for the verify rows, -1 for plain rows (a prompt's last token on any release; on 0.27.1 also a decode
without drafts). ``QwenGatedDeltaNetAttention._forward_core`` is the tree's own code, cut out of
``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`` with ``ast`` (the file cannot be imported
without vLLM's compiled parts) and run on a stand-in layer whose kernels do what the real ones do with the gates:
``fused_sigmoid_gating_delta_rule_update`` reads token t of sequence n at ``cu_seqlens[n] + t`` of the ``a``
and ``b`` it is given (third_party/flash_linear_attention/ops/fused_sigmoid_gating.py) and here writes those
gates as that token's output; the prefill path's ``fused_post_conv_prep`` turns token t's gates into its g and
beta and ``chunk_gated_delta_rule`` runs token t with row t of those (here: writes them); the convolutions pass
their input through. The layer's merged output then says, per token, which gates its row ran with.

0.27.1 runs the plain rows as non-spec decodes with the whole batch's gates; 0.29.0 aligned the spec part (vllm PR
#51812), 0.32.0 runs such rows through the prefill path with their own: the patch's ``Obsolete-If: test`` check
holds there."""

from __future__ import annotations

import ast
import builtins
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import tq_harness

pytestmark = pytest.mark.patch("gdn-align-the-gates-with-their-tokens-in-mixed-batches")

GDN = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
CLASS, METHOD = "QwenGatedDeltaNetAttention", "_forward_core"
PREFIX = "model.layers.0.linear_attn"
H = 2  # value heads


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
    raise AssertionError("not expected for this batch")


def _post_conv_prep(*, conv_output, a, b, **_):
    """Token t's q, k, v from row t of the convolution's output, its g and beta from row t of its gates (the real
    kernel maps a and b to g and beta element by element)."""
    return conv_output, conv_output, conv_output, a, b


def _chunk_kernel(*, q, g, beta, initial_state, **_):
    """Token t runs with row t of the g and beta it is given (as the FLA chunk kernel) and outputs them."""
    assert q.shape[0] == 1
    return torch.stack([g[0], beta[0]], dim=-1).unsqueeze(0), initial_state


def _run(tree: Path, meta: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    fn, code = _forward_core(tree)
    scope: dict[str, Any] = {
        "torch": torch,
        "GDNAttentionMetadata": type(meta),
        "get_forward_context": lambda: SimpleNamespace(attn_metadata={PREFIX: meta}),
        "is_conv_state_dim_first": lambda: True,
        "causal_conv1d_update": lambda x, *args, **kw: x,
        "causal_conv1d_fn": lambda x, *args, **kw: x,
        "fused_post_conv_prep": _post_conv_prep,
        "fused_sigmoid_gating_delta_rule_update": _gating_kernel,
    }
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for name in names - set(scope) - set(dir(builtins)) - {"self"}:
        scope.setdefault(name, _unused)  # any other module name the method reaches must not be called here
    exec(code, scope)
    n = a.shape[0]
    layer = SimpleNamespace(
        prefix=PREFIX, enable_packed_recurrent_decode=False, kv_cache=(torch.zeros(40, 8, 3), torch.zeros(40, H)),
        conv1d=SimpleNamespace(weight=torch.zeros(8, 1, 4), bias=None), activation="silu", A_log=None,
        dt_bias=None, num_k_heads=1, tp_size=1, head_k_dim=8, head_v_dim=8, chunk_gated_delta_rule=_chunk_kernel,
        rearrange_mixed_qkv=lambda x: (None, None, None) if x is None else (x.unsqueeze(0),) * 3)
    out = torch.full((n, H, 2), float("nan"))
    scope[METHOD](layer, torch.arange(n, dtype=torch.float32)[:, None].expand(n, 8), b, a, out)
    return out


K = 2
GDN_ATTN = "vllm/v1/attention/backends/gdn_attn.py"
UTILS = "vllm/v1/attention/backends/utils.py"
CHECKPOINT = "vllm/model_executor/layers/mamba/checkpoint.py"


def _builder(tree: Path) -> Any:
    """A GDN metadata builder holding data only (speculation with K drafts on, no FULL graphs, no prefix caching)
    whose methods are the tree's own, ``build`` included."""
    utils = {name: tq_harness.tree_class(tree, UTILS, name, torch=torch, MambaSpec=object)
             for name in ("mamba_get_block_table_tensor", "split_decodes_and_prefills")}
    metadata = tq_harness.tree_class(tree, GDN_ATTN, "GDNAttentionMetadata", dataclass=dataclasses.dataclass,
                                     torch=torch)
    builder = SimpleNamespace(
        use_spec_decode=True, num_spec=K, kv_cache_spec=None, use_full_cuda_graph=False, decode_cudagraph_max_bs=0,
        gdn_prefill_backend="triton", plan_flashinfer_checkpoints=False,
        vllm_config=SimpleNamespace(cache_config=SimpleNamespace(mamba_cache_mode="none")))
    if (tree / CHECKPOINT).is_file():  # 0.32 on: prefill checkpoints (none without prefix caching)
        builder.checkpoint_builder = object.__new__(
            tq_harness.tree_class(tree, CHECKPOINT, "MambaPrefillCheckpointBuilder"))
        builder.checkpoint_builder.vllm_config = builder.vllm_config
    # compute_causal_conv1d_metadata feeds only the convolution kernel, which passes its input through here.
    return tq_harness.bind_tree_methods(
        builder, tree, GDN_ATTN, "GDNAttentionMetadataBuilder", torch=torch, GDNAttentionMetadata=metadata,
        CommonAttentionMetadata=object, NULL_BLOCK_ID=0, compute_causal_conv1d_metadata=lambda qsl, device: (None,) * 3,
        async_tensor_h2d=lambda t, device, dtype=None: torch.as_tensor(t, dtype=dtype, device=device), **utils)


def _metadata(tree: Path, rows: list[tuple[int, bool]]) -> Any:
    """The tree's GDN metadata of decode rows of (tokens, spec?) in batch order: spec rows have tokens - 1 drafts,
    plain rows (-1) one token; every row 40 tokens long, its state slots 10 * row + column."""
    n = len(rows)
    q_lens = torch.tensor([q for q, _ in rows], dtype=torch.int32)
    qsl = torch.zeros(n + 1, dtype=torch.int32)
    qsl[1:] = q_lens.cumsum(0)
    seq = torch.full((n,), 40, dtype=torch.int32)
    cam = tq_harness.cam_class(tree)
    fields = {f.name for f in dataclasses.fields(cam)}
    values = dict(query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=n,
                  num_actual_tokens=int(qsl[-1]), max_query_len=int(q_lens.max()), max_seq_len=40,
                  block_table_tensor=torch.tensor([[10 * r + c for c in range(K + 1)] for r in range(n)],
                                                  dtype=torch.int32),
                  slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64), causal=True, seq_lens_cpu=seq,
                  num_computed_tokens_cpu=seq - q_lens, _seq_lens_cpu=seq, _num_computed_tokens_cpu=seq - q_lens,
                  seq_lens_cpu_upper_bound=seq, is_prefilling=torch.zeros(n, dtype=torch.bool))
    m = cam(**{k: v for k, v in values.items() if k in fields})
    drafts = torch.tensor([q - 1 if spec else -1 for q, spec in rows], dtype=torch.int32)
    return _builder(tree).build(0, m, num_accepted_tokens=torch.ones(n, dtype=torch.int32),
                                num_decode_draft_tokens_cpu=drafts)


@pytest.mark.parametrize("rows", [
    [(1, False), (3, True), (1, False)],  # a plain row first, as V1 may order them
    [(3, True), (1, False), (3, True)],  # verify rows first
], ids=["no-draft-first", "verify-first"])
def test_each_row_runs_with_its_own_gates(v027_tree, rows):
    """K = 2: verify rows of 3 tokens beside plain rows of one token."""
    meta = _metadata(v027_tree, rows)
    n = sum(q for q, _ in rows)
    a = torch.arange(n, dtype=torch.float32)[:, None] + torch.tensor([0.0, 0.5])  # token t: t, t + 0.5
    b = -a
    out = _run(v027_tree, meta, a, b)
    want = torch.stack([a, b], dim=-1)
    wrong = [t for t in range(n) if not torch.equal(out[t], want[t])]
    assert not wrong, (f"tokens {wrong} of {n} (rows {rows}: (tokens, spec)) ran with other tokens' gates: "
                       f"a seen {out[:, 0, 0].tolist()}, own {a[:, 0].tolist()}")
