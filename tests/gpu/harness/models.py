"""Tiny random-weight models, made locally with transformers (no hub, no tokenizer).

The weights are drawn from one seeded generator after the model is built, so the
same spec gives the same model on any host with the same transformers major. The
scales were chosen so that greedy output is varied (with transformers' own
initialisation a random model repeats one token, which cannot show a wrong
attention or state result) and yet repeats n-grams often enough that an ngram
drafter proposes drafts and some get accepted (a small vocabulary, unit-scale
embeddings): state-recovery bugs only show after an accepted draft.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """What to build: an architecture, its config overrides, the seed and the weight scale."""

    name: str
    arch: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    std: float = 0.02
    embed_std: float = 1.0

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


LLAMA6 = ModelSpec(
    name="llama6",
    arch="llama",
    config=dict(
        vocab_size=128, hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    seed=1,
    std=0.03,
)

# Attention every other layer: 6 attention layers among 12, so layers past TurboQuant's
# boundary protection (the first and last 2 attention layers) exist. vLLM's Qwen3-Next
# wants MoE layers: 4 small experts, 2 active, plus the shared expert.
QWEN3_NEXT12 = ModelSpec(
    name="qwen3next12",
    arch="qwen3_next",
    config=dict(
        vocab_size=64, hidden_size=512, intermediate_size=1024, num_hidden_layers=12,
        layer_types=["linear_attention", "full_attention"] * 6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, partial_rotary_factor=0.25,
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
        shared_expert_intermediate_size=256, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
    ),
    seed=1,
    std=0.02,
)

MODELS = {m.name: m for m in (LLAMA6, QWEN3_NEXT12)}


def _config(spec: ModelSpec):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen3_next": transformers.Qwen3NextConfig}[spec.arch]
    return cls(**spec.config, torch_dtype="bfloat16")


def instantiate(spec: ModelSpec, dtype=None):
    """The model in memory, weights drawn from the spec's seed."""
    import torch
    import transformers

    config = _config(spec)
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen3_next": transformers.Qwen3NextForCausalLM}[spec.arch]
    gen = torch.Generator().manual_seed(spec.seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or ".norm." in name or name.endswith("_norm.weight"):
                param.fill_(1.0)
            elif name.endswith("A_log"):
                param.copy_(torch.log(torch.empty(param.shape).uniform_(1, 16, generator=gen)))
            elif name.endswith("dt_bias"):
                param.fill_(1.0)
            elif "embed_tokens" in name or "lm_head" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * spec.embed_std)
            elif param.dim() == 1:
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * spec.std)
    return model.to(dtype) if dtype is not None else model


def build(spec: ModelSpec, root: Path) -> Path:
    """Save the model under root/<name>-<digest> once; return its directory."""
    import hashlib

    import torch

    digest = hashlib.sha256(spec.key().encode()).hexdigest()[:10]
    dest = root / f"{spec.name}-{digest}"
    if (dest / "config.json").exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    model = instantiate(spec, torch.bfloat16)
    model.save_pretrained(tmp)
    tmp.rename(dest)
    return dest
