"""How far K/V noise of a KV-cache quantizer's size moves a test model's greedy tokens, against its margins.

The forced oracle can judge a scenario only where the reference's own noise (a plain decode of the same quantized
cache, batched and chunked otherwise) stays below the model's median top-1/top-2 margin. A model that amplifies
small attention differences makes that noise large whatever the kernels do. This measures the amplification on
the CPU, with transformers' own forward of the harness's models (float32): each prompt of the scenarios is
continued greedily, then run again with Gaussian noise of ``eps`` times the tensor's RMS added to every attention
layer's K and V projections (4-bit MSE quantization of a unit Gaussian leaves about 0.1, 3-bit about 0.18). Per
model: the median margin of the clean run, the distinct tokens of each continuation, and per ``eps`` the largest
miss (the clean top logprob minus the clean logprob of the noisy run's greedy token) and how many positions
changed their greedy token. eps = 1.0 stands for a fault (attention over garbage): there the misses must be large.

    cd gpu && python -m harness.sensitivity [--tokens 48] [--eps 0.05,0.1,0.2,1.0]

Figures, no assertions. Needs transformers and torch (the GPU host's stack has both; any CPU will do).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from harness import models
from harness.scenarios import prompts


def _logprobs(model, ids: list[int], eps: float, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    hooks = []
    if eps:
        def noisy(_module, _inputs, out):
            return out + out.float().pow(2).mean().sqrt() * eps * torch.randn(out.shape, generator=gen)

        for name, module in model.named_modules():
            if name.endswith(("self_attn.k_proj", "self_attn.v_proj")):
                hooks.append(module.register_forward_hook(noisy))
    try:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    finally:
        for h in hooks:
            h.remove()


def _continue(model, prompt: tuple[int, ...], tokens: int) -> list[int]:
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


def measure(spec: models.ModelSpec, tokens: int, eps_values: list[float], seed: int = 0) -> dict:
    """The clean margins and distinct tokens, and per eps the largest miss and the share of changed choices."""
    import torch

    model = models.instantiate(spec, torch.float32).eval()
    runs = [_continue(model, p, tokens) for p in prompts(spec.config["vocab_size"])]
    clean = [_logprobs(model, ids, 0.0, 0)[len(ids) - tokens - 1:-1] for ids in runs]
    tops = [lp.topk(2, -1).values for lp in clean]
    margins = [m for top in tops for m in (top[:, 0] - top[:, 1]).tolist()]
    result = {"margin": statistics.median(margins), "distinct": [len(set(ids[-tokens:])) for ids in runs], "eps": {}}
    for eps in eps_values:
        misses = []
        for i, (ids, lp) in enumerate(zip(runs, clean, strict=True), start=1):
            picked = _logprobs(model, ids, eps, 1000 * seed + i)[len(ids) - tokens - 1:-1].argmax(-1)
            misses += (lp.max(-1).values - lp.gather(1, picked[:, None])[:, 0]).tolist()
        result["eps"][eps] = (max(misses), sum(m > 0 for m in misses) / len(misses))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=48, help="greedy tokens after each prompt")
    parser.add_argument("--eps", default="0.05,0.1,0.2,1.0", help="noise, as a fraction of the tensor's RMS")
    parser.add_argument("--seed", type=int, default=0, help="the noise's draw")
    args = parser.parse_args(argv)
    eps_values = [float(e) for e in args.eps.split(",")]
    unscaled = replace(models.QWEN3_NEXT12_G6D256_MTP, name="g6d256, o_proj at std 0.02 (before)", std_overrides=())
    for spec in (models.QWEN3_NEXT12_DENSE_MTP, unscaled, models.QWEN3_NEXT12_G6D256_MTP):
        r = measure(spec, args.tokens, eps_values, args.seed)
        cells = "  ".join(f"eps {e}: miss <= {m:6.2f}, {100 * f:3.0f}% changed" for e, (m, f) in r["eps"].items())
        print(f"{spec.name:40} median margin {r['margin']:6.2f}  distinct {r['distinct']}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
