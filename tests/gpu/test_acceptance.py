"""harness.acceptance on CPU: the weights it writes give the next-token rule it promises, on a small model whose
parameters carry the names and norm classes of vLLM's Qwen3-Next and its MTP layer, and its calibration finds the
rate it is asked for."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from harness import acceptance  # noqa: E402

VOCAB, HIDDEN = 512, 128


class GemmaRMSNorm(nn.Module):
    """x * (1 + w), as Qwen3-Next's norms."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((HIDDEN,), 0.3))

    def forward(self, x):
        return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * (1 + self.weight)


class Layer(nn.Module):
    """A causal mean-attention and an MLP, each writing into the residual stream through a named projection."""

    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = GemmaRMSNorm(), GemmaRMSNorm()
        self.self_attn = nn.Module()
        self.self_attn.v_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.self_attn.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.mlp = nn.Module()
        self.mlp.up_proj = nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
        self.mlp.down_proj = nn.Linear(4 * HIDDEN, HIDDEN, bias=False)

    def forward(self, h):
        v = self.self_attn.v_proj(self.input_layernorm(h))
        mean = v.cumsum(0) / torch.arange(1, len(h) + 1).unsqueeze(1)
        h = h + self.self_attn.o_proj(torch.tanh(mean))
        return h + self.mlp.down_proj(torch.nn.functional.silu(self.mlp.up_proj(self.post_attention_layernorm(h))))


class FakeForCausalLM(nn.Module):
    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=VOCAB)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(VOCAB + 64, HIDDEN)  # padded, as vLLM's
        self.model.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.model.norm = GemmaRMSNorm()
        self.lm_head = nn.Linear(HIDDEN, VOCAB + 64, bias=False)

    def forward(self, tokens):
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h)
        return h, self.lm_head(self.model.norm(h))[:, :VOCAB]


class FakeMTP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(VOCAB + 64, HIDDEN)
        self.model.pre_fc_norm_embedding, self.model.pre_fc_norm_hidden = GemmaRMSNorm(), GemmaRMSNorm()
        self.model.fc = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)
        self.model.layers = nn.ModuleList([Layer()])
        self.model.norm = GemmaRMSNorm()
        self.lm_head = nn.Linear(HIDDEN, VOCAB + 64, bias=False)

    def forward(self, tokens, hidden):
        x = torch.cat([self.model.pre_fc_norm_embedding(self.model.embed_tokens(tokens)),
                       self.model.pre_fc_norm_hidden(hidden)], -1)
        x = self.model.layers[0](self.model.fc(x))
        return self.lm_head(self.model.norm(x))[:, :VOCAB]


def _worker():
    """A worker as vLLM's V1 runner holds them: the target on the runner, the MTP module on its drafter."""
    runner = SimpleNamespace(model=FakeForCausalLM(), drafter=SimpleNamespace(model=FakeMTP()), other=[1, 2])
    return SimpleNamespace(model_runner=runner)


def _rule() -> torch.Tensor:
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(acceptance.SEED))


@torch.no_grad()
def _follow_rate(worker, alpha: float) -> float:
    acceptance.set_weights(worker, alpha)
    target = worker.model_runner.model
    tokens = torch.randint(VOCAB, (256,), generator=torch.Generator().manual_seed(1))
    _, logits = target(tokens)
    return (logits.argmax(-1) == _rule()[tokens]).float().mean().item()


def test_small_alpha_makes_the_target_follow_the_rule_and_large_alpha_breaks_it():
    worker = _worker()
    assert _follow_rate(worker, 1e-3) == 1.0
    assert _follow_rate(worker, 1e2) < 0.2


def test_the_mtp_layer_drafts_the_rule_whatever_the_hidden_state():
    worker = _worker()
    acceptance.set_weights(worker, 1e2)  # a target that rarely follows the rule: the drafts still do
    tokens = torch.randint(VOCAB, (64,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for hidden in (torch.zeros(64, HIDDEN), 100 * torch.randn(64, HIDDEN)):
            drafts = worker.model_runner.drafter.model(tokens, hidden).argmax(-1)
            assert torch.equal(drafts, _rule()[tokens])


def test_the_same_alpha_writes_the_same_weights():
    first, second = _worker(), _worker()
    acceptance.set_weights(first, 0.7)
    acceptance.set_weights(second, 2.0)
    acceptance.set_weights(second, 0.7)
    for (name, a), (_, b) in zip(first.model_runner.model.named_parameters(),
                                 second.model_runner.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_two_targets_are_refused():
    worker = _worker()
    worker.model_runner.spare = FakeForCausalLM()
    with pytest.raises(RuntimeError, match="one target"):
        acceptance.set_weights(worker, 1.0)


def test_calibration_lands_within_the_tolerance():
    applied = []

    def rate() -> float:  # falls with alpha, as the engine's acceptance does
        return 1 / (1 + (applied[-1] / 3.0) ** 2)

    alpha, probes = acceptance.calibrate(applied.append, rate, goal=0.75, tolerance=0.01)
    assert abs(rate() - 0.75) <= 0.01
    assert applied[-1] == alpha and len(probes) < 14
    assert math.isclose(alpha, 3.0 * math.sqrt(1 / 0.75 - 1), rel_tol=0.05)


def test_counters_give_acceptance_length_and_first_position_rate():
    spec = {"num_drafts": 10.0, "num_accepted_tokens": 18.0, "num_accepted_tokens_per_pos": [8.0, 6.0, 4.0]}
    assert acceptance.acceptance_length(spec) == pytest.approx(2.8)
    assert acceptance.first_position_rate(spec) == pytest.approx(0.8)
    assert acceptance.acceptance_length({}) is None
