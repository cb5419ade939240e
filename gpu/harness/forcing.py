"""Teacher-forced decoding: a vLLM logits processor that makes an engine emit given tokens.

The reference of a TurboQuant scenario must see the same quantized KV cache as the engine under
test. A prefill over prompt + output (the `teacher` oracle) attends to exact K/V, a decode to the
quantized cache, so with TurboQuant the two disagree by several nats and judge nothing. Forcing a
plain (no speculation) engine to follow the test's tokens makes it decode exactly the test's
prefixes, one token a step, over the same quantized cache; the raw logprobs vLLM reports
(`logprobs_mode="raw_logprobs"`, computed before logits processors) are the ones that engine had
before the forcing, so each test token can be scored against the plain decode's greedy choice.

The tokens to force come per request in `SamplingParams.extra_args["force_tokens"]`. Imported in
the engine's process only (it needs vLLM).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

FORCE_KEY = "force_tokens"


class ForceTokens(LogitsProcessor):
    """Masks every logit but the forced token's at each step of a request that names tokens."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        # batch row -> (tokens to force, the request's live output token list)
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            forced = (params.extra_args or {}).get(FORCE_KEY) if params is not None else None
            if forced is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = (list(forced), output)
        for src, dst, direction in batch_update.moved:
            moving = self.rows.pop(src, None)
            if direction == MoveDirectionality.SWAP:
                other = self.rows.pop(dst, None)
                if other is not None:
                    self.rows[src] = other
            else:
                self.rows.pop(dst, None)
            if moving is not None:
                self.rows[dst] = moving

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (forced, output) in self.rows.items():
            step = len(output)
            if step < len(forced):
                token = forced[step]
                logits[index].fill_(float("-inf"))
                logits[index, token] = 0.0
        return logits


def forced_gaps(outputs: list[Any], forced: list[list[int]]) -> list[dict[str, Any]]:
    """Per prompt: `gap` (the plain decode's top logprob minus the forced token's, 0 when the test's
    token is the greedy choice), `margin` (top-1 minus top-2) and `followed` (whether the engine
    emitted exactly the forced tokens, without which the gaps mean nothing)."""
    result = []
    for out, tokens in zip(outputs, forced, strict=True):
        completion = out.outputs[0]
        gaps, margins = [], []
        for token, entry in zip(tokens, completion.logprobs or [], strict=False):
            ranked = sorted((lp.logprob for lp in entry.values()), reverse=True)
            gaps.append(round(ranked[0] - entry[token].logprob, 5) if token in entry else None)
            margins.append(round(ranked[0] - ranked[1], 5) if len(ranked) > 1 else None)
        result.append({"gap": gaps, "margin": margins, "followed": list(completion.token_ids) == list(tokens)})
    return result
