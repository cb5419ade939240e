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
    # Multi-token-prediction layers (Qwen3-Next MTP): `num_nextn_predict_layers` in the config and
    # `mtp.*` tensors, the decoder layer a random copy of a full-attention layer's shapes.
    mtp_layers: int = 0
    # False: only config.json is written; the engine runs with load_format="dummy" (vLLM draws the
    # weights), for models too large to make here that are used for memory figures only.
    weights: bool = True
    # (name suffix, std): matrices whose parameter name ends so are drawn at that scale instead of `std`.
    std_overrides: tuple[tuple[str, float], ...] = ()

    def key(self) -> str:
        fields = asdict(self)
        if not self.std_overrides:  # the models made before the field existed keep their digests
            del fields["std_overrides"]
        return json.dumps(fields, sort_keys=True)

    def std_of(self, name: str) -> float:
        """The scale a random matrix named ``name`` is drawn at."""
        return next((std for suffix, std in self.std_overrides if name.endswith(suffix)), self.std)


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

# 28 layers, 32 query and 8 KV heads of 128: TurboQuant quantizes 24 of them (boundary layers
# excepted). For KV cache capacity at vLLM's default memory settings only (dummy weights).
LLAMA28 = ModelSpec(
    name="llama28",
    arch="llama",
    config=dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=28,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    weights=False,
)

# The same hybrid (the same main weights) with one random MTP layer for `method: mtp` drafting.
QWEN3_NEXT12_MTP = ModelSpec(name="qwen3next12-mtp", arch="qwen3_next", config=QWEN3_NEXT12.config, seed=1,
                             std=0.02, mtp_layers=1)

# The hybrid with every expert active for every token (top-4 of 4), and its MTP layer: the model of
# the combined and preemption scenarios. A top-2 router of random experts at a near-tie (gaps of
# 1e-3 occur on the model above) turns the bf16 rounding differences between a token computed as a
# row of a verify batch and the same token decoded alone into a different pair of experts, and that
# token's logits move by up to 18 nats: noise no oracle can tell from a fault. With all experts
# active the layer is a continuous function of its input again. (vLLM 0.20's Qwen3-Next needs at
# least one MoE layer, so the MLPs cannot simply be dense.)
QWEN3_NEXT12_DENSE_MTP = ModelSpec(
    name="qwen3next12-allexperts-mtp", arch="qwen3_next",
    config={**QWEN3_NEXT12.config, "num_experts_per_tok": QWEN3_NEXT12.config["num_experts"]},
    seed=1, std=0.02, mtp_layers=1)

# The attention geometry of the users' Qwen3.6-27B-class hybrids (24 query / 4 KV heads, head dim 256:
# G=6, the case the multi-query kernel tiles most tightly) on the dense hybrid above, with positions
# for prompts of several thousand tokens. The output projection reads 24 x 256 = 6,144 features where the
# dense hybrid's reads 4 x 128 = 512, so at the same std each attention layer wrote into the residual stream
# at 12 times the variance, and K/V noise of a 4-bit quantizer's size moved its greedy tokens 6 times as far
# (`python -m harness.sensitivity`): the forced oracle's own calibration missed by 19-27 nats against margins of
# 11-27 and could judge nothing. Its std is scaled by sqrt(512 / 6144), which gives the dense hybrid's gain.
O_PROJ_512 = ("self_attn.o_proj.weight", round(0.02 * (512 / 6144) ** 0.5, 5))
QWEN3_NEXT12_G6D256_MTP = ModelSpec(
    name="qwen3next12-allexperts-mtp-g6d256-o", arch="qwen3_next",
    config={**QWEN3_NEXT12_DENSE_MTP.config, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
            "max_position_embeddings": 16384},
    seed=1, std=0.02, mtp_layers=1, std_overrides=(O_PROJ_512,))

# Llama 6's dense layers in the users' attention geometry (24/4 heads of 256; hidden 768, a multiple of the head
# count, as newer transformers check), the output projection scaled down as the hybrid's above (24 x 256 features
# where Llama 6 reads 4 x 128): a model without MoE layers (whose kernel compiles at each new token count in the
# release too), so vLLM's JIT monitor in its error mode can hold through a whole run.
LLAMA6_G6D256 = ModelSpec(
    name="llama6-g6d256-o", arch="llama",
    config={**LLAMA6.config, "hidden_size": 768, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256},
    seed=1, std=0.03, std_overrides=(("self_attn.o_proj.weight", round(0.03 * (512 / 6144) ** 0.5, 5)),))

# Llama-3.1-8B's shapes (32 layers, 32/8 heads of 128, 16 GB of bfloat16 weights), for memory figures only.
LLAMA8B = ModelSpec(
    name="llama8b-shaped",
    arch="llama",
    config=dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    weights=False,
)

# Qwen3.6-27B's attention and GDN shapes (hidden 5120; 24/4 heads of 256; GDN 16/48 heads of 128; three GDN
# layers to one attention layer) in 16 layers (13 GB of bfloat16 weights, so it fits a 24 GB card with room for
# a KV cache), with its MTP layer, for memory figures only. Qwen3-Next wants MoE layers: 4 experts, all
# active, of a quarter of the dense MLP each.
QWEN27B_SHAPED_MTP = ModelSpec(
    name="qwen27b-shaped-16l-mtp",
    arch="qwen3_next",
    config=dict(
        vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=16,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 4,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256, partial_rotary_factor=0.25,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=4, moe_intermediate_size=4352,
        shared_expert_intermediate_size=512, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
    ),
    mtp_layers=1,
    weights=False,
)

# The same widths in 8 layers (6 GDN, 2 attention: the 3:1 mix), for speed figures with several engines on one
# GPU at once (about 9 GB of weights each). Its weights are vLLM's dummy ones until a benchmark writes
# harness.acceptance's controlled-acceptance weights into the running engine.
QWEN27B_SHAPED_8L_MTP = ModelSpec(
    name="qwen27b-shaped-8l-mtp",
    arch="qwen3_next",
    config={**QWEN27B_SHAPED_MTP.config, "num_hidden_layers": 8,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2},
    mtp_layers=1,
    weights=False,
)

# The 16-layer model at Qwen3.6-27B's own context (262,144 positions), for the long-prompt memory figures.
QWEN27B_SHAPED_256K_MTP = ModelSpec(
    name="qwen27b-shaped-16l-mtp-256k",
    arch="qwen3_next",
    config={**QWEN27B_SHAPED_MTP.config, "max_position_embeddings": 262144},
    mtp_layers=1,
    weights=False,
)

MODELS = {m.name: m for m in (LLAMA6, QWEN3_NEXT12, QWEN3_NEXT12_MTP, QWEN3_NEXT12_DENSE_MTP, QWEN3_NEXT12_G6D256_MTP,
                              LLAMA6_G6D256, LLAMA28, LLAMA8B, QWEN27B_SHAPED_MTP, QWEN27B_SHAPED_8L_MTP,
                              QWEN27B_SHAPED_256K_MTP)}


CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}


def _config(spec: ModelSpec):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen3_next": transformers.Qwen3NextConfig}[spec.arch]
    return cls(**spec.config, torch_dtype="bfloat16")


def instantiate(spec: ModelSpec, dtype=None):
    """The model in memory, weights drawn from the spec's seed."""
    import torch
    import transformers

    config = _config(spec)
    model_cls = getattr(transformers, CAUSAL_LM[spec.arch])
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
                param.copy_(torch.randn(param.shape, generator=gen) * spec.std_of(name))
    return model.to(dtype) if dtype is not None else model


def build(spec: ModelSpec, root: Path) -> Path:
    """Save the model under root/<name>-<digest> once; return its directory.

    Harness processes started together on one --work folder may build the same model at once, so
    each writes into a temporary folder of its own (a shared `<dest>.tmp` let one process's rename
    pull the folder from under another's save) and renames it into place; the loser of the rename
    drops its copy and uses the winner's (the same weights: one seed).
    """
    import hashlib
    import os
    import shutil
    import tempfile

    import torch

    digest = hashlib.sha256(spec.key().encode()).hexdigest()[:10]
    dest = root / f"{spec.name}-{digest}"
    if (dest / "config.json").exists():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=dest.name + "."))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the model is shared like any other folder
        if spec.weights:
            model = instantiate(spec, torch.bfloat16)
            model.save_pretrained(tmp)
            if spec.mtp_layers:
                _add_mtp(spec, model, tmp)
        else:
            _config(spec).save_pretrained(tmp)
            config = json.loads((tmp / "config.json").read_text())
            # A bare config names no architecture, and vLLM would take transformers' base model for its
            # model_type: for qwen3_next that is Qwen3NextModel, which it serves as a pooling model.
            config["architectures"] = [CAUSAL_LM[spec.arch]]
            if spec.mtp_layers:  # vLLM draws the MTP module's weights too
                config["num_nextn_predict_layers"] = spec.mtp_layers
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename won
    return dest


def _add_mtp(spec: ModelSpec, model, root: Path) -> None:
    """Give a saved Qwen3-Next model the MTP module vLLM's qwen3_next_mtp.py loads: fc (2h -> h),
    the pre-fc norms, a final norm, and decoder layers shaped like the model's first full-attention
    layer (random weights drawn from the spec's seed: the drafts are rarely accepted)."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((root / "config.json").read_text())
    config["num_nextn_predict_layers"] = spec.mtp_layers
    (root / "config.json").write_text(json.dumps(config, indent=2))
    files = sorted(root.glob("*.safetensors"))
    if len(files) != 1:
        raise RuntimeError(f"expected one safetensors file in {root}, found {len(files)}")
    tensors = load_file(files[0])
    gen = torch.Generator().manual_seed(spec.seed + 1000)
    hidden = config["hidden_size"]
    first_full = config["layer_types"].index("full_attention")
    prefix = f"model.layers.{first_full}."
    extra = {"mtp.fc.weight": torch.randn(hidden, 2 * hidden, generator=gen) * spec.std}
    for name in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        extra[f"mtp.{name}.weight"] = torch.ones(hidden)
    for i in range(spec.mtp_layers):
        for name, t in tensors.items():
            if name.startswith(prefix):
                rest = name[len(prefix):]
                norm = "norm" in rest.rsplit(".", 2)[-2]
                extra[f"mtp.layers.{i}.{rest}"] = (
                    torch.ones(t.shape) if norm else torch.zeros(t.shape) if t.dim() == 1
                    else torch.randn(t.shape, generator=gen) * spec.std_of(rest))
    save_file({**tensors, **{k: v.to(torch.bfloat16).contiguous() for k, v in extra.items()}}, str(files[0]),
              metadata={"format": "pt"})
