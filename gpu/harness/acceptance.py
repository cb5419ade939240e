"""Random weights whose MTP drafts are accepted at a chosen rate, set inside a running engine.

Random weights make drafts almost never accepted (0.01-0.12 on the test models), so a benchmark
of them times the verify path, not what speculation gains. This module gives the engine's model a
known next-token rule that its random layers perturb by a chosen amount:

- the embedding is a random matrix R (rows of unit RMS) and the LM head is R with its rows permuted
  by a fixed random permutation p (row p(t) of the head is R[t]), with the final norms neutral; a
  residual stream that stays near R[t] therefore predicts p(t);
- every other weight is random (standard deviation 1 / sqrt(fan-in)), and the projections that
  write into the residual stream (attention's and GDN's output projections, the MLPs' and experts'
  down projections) are scaled by `alpha`: the larger alpha, the more the context moves the stream
  away from R[t], and the more often the target's greedy token is not p(t);
- the MTP layer reads only the embedding of its input token (its fc is the identity on that half)
  and writes nothing into its residual stream, so it always drafts p(next), p(p(next)), ...

A draft is accepted where the target follows p, so alpha sets the acceptance, and `calibrate`
finds the alpha that gives a chosen first-position acceptance on the engine itself. The weights are
written in place after the engine has booted (its CUDA graphs read them where they are), from
seeded generators on the GPU, so every engine given the same alpha holds the same model.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

# Projections that write into the residual stream, by parameter name ending.
RESIDUAL_WRITERS = ("o_proj.weight", "out_proj.weight", "down_proj.weight", "w2_weight")
SEED = 20261126


def _models(worker: Any) -> tuple[Any, Any | None]:
    """(target, MTP drafter or None): the nn.Modules under the worker's model runner (V1 or V2), found
    by their classes' names within three attribute levels, through CUDA-graph wrappers."""
    import torch
    import torch.nn as nn

    found: dict[int, nn.Module] = {}
    seen: set[int] = set()
    level = [getattr(worker, "worker", worker).model_runner]
    for _ in range(4):
        following = []
        for obj in level:
            if id(obj) in seen or not hasattr(obj, "__dict__") or isinstance(obj, (type, torch.Tensor)):
                continue
            seen.add(id(obj))
            if isinstance(obj, nn.Module):
                name = type(obj).__name__
                if name.endswith(("ForCausalLM", "MTP")):
                    found[id(obj)] = obj
                continue  # the modules inside are the model's own
            following += list(vars(obj).values())
        level = following
    targets = [m for m in found.values() if type(m).__name__.endswith("ForCausalLM")]
    drafts = [m for m in found.values() if type(m).__name__.endswith("MTP")]
    if len(targets) != 1 or len(drafts) > 1:
        raise RuntimeError(f"expected one target and at most one MTP module, found "
                           f"{sorted(type(m).__name__ for m in found.values())}")
    return targets[0], (drafts[0] if drafts else None)


def _fill(param, name: str, scale: float, device) -> None:
    import torch

    gen = torch.Generator(device=device).manual_seed(SEED ^ zlib.crc32(name.encode()))
    values = torch.randn(param.shape, generator=gen, device=device, dtype=param.dtype)
    param.data.copy_(values.mul_(scale / math.sqrt(param.shape[-1])))  # in the weights' dtype: no fp32 copy


def _neutral_norms(model) -> None:
    """Gemma-style norms (x * (1 + w): Qwen3-Next's) at w = 0, plain RMS norms (x * w) at w = 1."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        kind = type(module).__name__
        if weight is None or "Norm" not in kind:
            continue
        weight.data.fill_(0.0 if "Gemma" in kind else 1.0)


def set_weights(worker: Any, alpha: float) -> dict[str, Any]:
    """Write the construction of the module docstring into the worker's target (and MTP drafter)."""
    import torch

    target, draft = _models(worker)
    embed = next(p for n, p in target.named_parameters() if n.endswith("embed_tokens.weight"))
    device = embed.device
    vocab = min(getattr(getattr(target, "config", None), "vocab_size", embed.shape[0]), embed.shape[0])
    gen = torch.Generator(device=device).manual_seed(SEED)
    rows = torch.randn((vocab, embed.shape[1]), generator=gen, device=device, dtype=embed.dtype)
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(SEED)).to(device)
    written = 0
    for model, is_draft in ((target, False), (draft, True)):
        if model is None:
            continue
        for name, param in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                param.data.zero_()
                param.data[:vocab].copy_(rows)
            elif name.endswith("lm_head.weight"):
                param.data.zero_()
                param.data[perm] = rows  # head row p(t) is R[t]: the argmax over the head at R[t] is p(t)
            elif param.dim() < 2:
                continue  # norms below; A_log, dt_bias and biases keep their values
            elif name.endswith(RESIDUAL_WRITERS):
                if is_draft:
                    param.data.zero_()
                else:
                    _fill(param, name, alpha, device)
            elif is_draft and name.endswith("fc.weight"):
                hidden = param.shape[0]
                param.data.zero_()
                param.data[:, :hidden].copy_(torch.eye(hidden, device=device))
            else:
                _fill(param, ("draft." if is_draft else "") + name, 1.0, device)
            written += param.numel()
        _neutral_norms(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"target": type(target).__name__, "draft": type(draft).__name__ if draft else None,
            "parameters": written}


def first_position_rate(spec: dict[str, Any]) -> float | None:
    """Accepted first drafts per draft round, from the spec-decode counters of a run."""
    per_pos = spec.get("num_accepted_tokens_per_pos") or []
    drafts = spec.get("num_drafts", 0.0)
    return per_pos[0] / drafts if per_pos and drafts else None


def acceptance_length(spec: dict[str, Any]) -> float | None:
    """Tokens a verify step emits on average: 1 + accepted draft tokens per draft round."""
    drafts = spec.get("num_drafts", 0.0)
    return 1.0 + spec.get("num_accepted_tokens", 0.0) / drafts if drafts else None


def calibrate(apply, measure, goal: float, tolerance: float = 0.03, low: float = 1e-3, high: float = 1e3,
              probes: int = 14) -> tuple[float, list[tuple[float, float]]]:
    """The alpha whose first-position acceptance is within ``tolerance`` of ``goal``: bisection on log alpha
    (acceptance falls as alpha grows). ``apply(alpha)`` sets the weights, ``measure()`` returns the rate;
    the closest probe wins if none lands within the tolerance. Returns (alpha, [(alpha, rate), ...])."""
    tried: list[tuple[float, float]] = []
    for _ in range(probes):
        alpha = math.sqrt(low * high)
        apply(alpha)
        rate = measure()
        tried.append((alpha, rate))
        if abs(rate - goal) <= tolerance:
            break
        low, high = (alpha, high) if rate > goal else (low, alpha)
    best = min(tried, key=lambda t: abs(t[1] - goal))[0]
    if best != tried[-1][0]:
        apply(best)
    return best, tried
