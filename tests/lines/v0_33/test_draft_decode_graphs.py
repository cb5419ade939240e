"""The drafter's single-token decode steps keep FULL CUDA graphs where the target's verify batches cannot have
them (the line's patch 0010).

vLLM resolves one CUDA graph mode for the target from the attention backends' support. Where TurboQuant's
multi-query route steps aside (``VLLM_TURBOQUANT_ATTENTION_KERNEL=decode``, a GPU that takes no tiling of the
kernel, FlyDSL), its builder supports FULL graphs for single-token decodes only
(``UNIFORM_SINGLE_TOKEN_DECODE``), so with speculation (decodes of 1 + K tokens) vLLM turns the requested
FULL_AND_PIECEWISE into PIECEWISE and writes that into the config. Model Runner V2's drafter then derives its
own decode graphs from the resolved mode: PIECEWISE has no FULL decode part, and PIECEWISE graphs are not
supported for draft decodes, so its K-1 single-token steps ran with no graph at all, where the release (whose
TurboQuant builder claims UNIFORM_BATCH) replays them in FULL graphs.

These tests run the tree's own ``TargetDependentARSpeculator.__init__`` and ``init_cudagraph_manager`` (MTP's and
EAGLE's base) in the order the V2 runner calls them: the speculator built from the config as the user left it,
then the config resolved, then the graph managers made for the resolved mode, with the drafter's attention
support taken from the tree's TurboQuant builder on the route's fallback. The graph managers are recorders of
the mode each is made for (nothing is captured on a CPU).
"""

from __future__ import annotations

import enum
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import tq_harness

import vllm_tree

pytestmark = pytest.mark.patch("spec-decode-v2-draft-decodes-keep-full-graphs")

SPECULATOR = "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py"
K = 3


class Managers:
    """Stands in for SpeculatorCudaGraphManager: records the mode and query length each manager is made for."""

    def __init__(self) -> None:
        self.made: list[tuple[object, int | None]] = []
        self.logged: list[str] = []
        # vLLM's logger, as far as the speculator's graph set-up uses it.
        record = lambda msg, *args, **kw: self.logged.append(msg % args)  # noqa: E731
        self.logger = SimpleNamespace(info=record, info_once=record, warning=record, warning_once=record)

    def __call__(self, vllm_config, device, cudagraph_mode, *args, decode_query_len=None):
        self.made.append((cudagraph_mode, args[0] if args else decode_query_len))
        return SimpleNamespace(cudagraph_mode=cudagraph_mode)


@pytest.fixture(scope="module")
def modes(v033_tree: Path):
    if not (v033_tree / SPECULATOR).is_file():
        pytest.skip("this vLLM keeps Model Runner V2's drafter elsewhere (spec_decode/autoregressive, 0.25-0.27), "
                    "where V1 is the hybrids' default; the line does not carry the patch")
    return SimpleNamespace(
        graphs=tq_harness.tree_class(v033_tree, "vllm/config/compilation.py", "CUDAGraphMode", enum=enum),
        support=tq_harness.tree_class(v033_tree, "vllm/v1/attention/backend.py", "AttentionCGSupport",
                                      Enum=enum.Enum))


def _speculator(tree: Path, modes, requested, managers: Managers):
    """A speculator whose __init__ and init_cudagraph_manager are the tree's; DraftModelSpeculator.__init__
    (not under test) sets what it sets in vLLM from the config: the sizes the tensors are made with."""
    names = {"torch": torch, "CUDAGraphMode": modes.graphs, "AttentionCGSupport": modes.support,
             "SpeculatorCudaGraphManager": managers, "logger": managers.logger}

    class Speculator:
        pass

    spec = Speculator()

    def base_init(vllm_config, device):
        spec.vllm_config, spec.device = vllm_config, device
        spec.max_num_tokens, spec.max_num_reqs, spec.hidden_size, spec.dtype = 16, 4, 8, torch.float32
        spec.num_speculative_steps = K

    config = SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_mode=requested))
    init = vllm_tree.load_function(tree, SPECULATOR, "TargetDependentARSpeculator.__init__",
                                   super=lambda: SimpleNamespace(__init__=base_init), **names)
    init(spec, config, torch.device("cpu"))
    tq_harness.bind_tree_methods(spec, tree, SPECULATOR, "TargetDependentARSpeculator", **names)
    return spec, config


def _drafter_support_on_the_fallback(v033_tree: Path, monkeypatch):
    """The TurboQuant builder's support on a CUDA device (stand-in: device 0) with the multi-query route switched
    off by its environment variable."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    tq, _, _ = tq_harness.load(v033_tree)
    monkeypatch.setattr(tq, "_MULTI_QUERY_ROUTE", {}, raising=False)
    monkeypatch.setattr(tq.envs, "VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode")
    config = tq_harness.vllm_config(K, 24, cache_dtype="turboquant_4bit_nc")
    spec = SimpleNamespace(num_kv_heads=4, head_size=256, block_size=16,
                           kv_quant_mode=SimpleNamespace(name="TURBOQUANT_4BIT_NC"))
    return tq.TurboQuantAttentionBackend.get_builder_cls().get_cudagraph_support(config, spec)


def _managers_after_resolution(v033_tree, modes, requested, resolved, support):
    """The runner's order: speculator built, config resolved (overwritten), drafter's support set, managers made."""
    managers = Managers()
    spec, config = _speculator(v033_tree, modes, requested, managers)
    config.compilation_config.cudagraph_mode = resolved
    spec.attn_cg_support = SimpleNamespace(min_cg_support=support, min_cg_attn_backend="TurboQuantAttentionBackend")
    spec.init_cudagraph_manager(resolved)
    return managers


def test_draft_decodes_keep_full_graphs_when_the_target_falls_back_to_piecewise(v033_tree, modes):
    """FULL_AND_PIECEWISE asked for, the target resolved to PIECEWISE by a backend that replays single-token
    decodes only, the drafter's attention such a backend: its first step follows the target, its decodes keep
    FULL graphs, and one line says so. (Whichever backend; the patch's Obsolete-If check.)"""
    g = modes.graphs
    managers = _managers_after_resolution(v033_tree, modes, g.FULL_AND_PIECEWISE, g.PIECEWISE,
                                          modes.support.UNIFORM_SINGLE_TOKEN_DECODE)
    made = managers.made
    assert made[0] == (g.PIECEWISE, K + 1), "the first draft step follows the target's mode"
    assert made[1] == (g.FULL_DECODE_ONLY, 1), f"draft decode steps run with {made[1][0]} instead of FULL graphs"
    assert [m for m in managers.logged if "FULL" in m and "PIECEWISE" in m], managers.logged


def test_turboquant_off_its_route_is_such_a_backend(v033_tree, modes, monkeypatch):
    """TurboQuant's builder where the multi-query route steps aside (VLLM_TURBOQUANT_ATTENTION_KERNEL=decode, on a
    CUDA device): single-token decodes only, so the case above is the users' fallback, and the drafter's decodes
    there keep FULL graphs."""
    support = _drafter_support_on_the_fallback(v033_tree, monkeypatch)
    # The tree's own enum member, by name (each loaded file compiles its own copy of the class).
    assert support.name == "UNIFORM_SINGLE_TOKEN_DECODE"
    g = modes.graphs
    managers = _managers_after_resolution(v033_tree, modes, g.FULL_AND_PIECEWISE, g.PIECEWISE,
                                          modes.support[support.name])
    assert managers.made[1] == (g.FULL_DECODE_ONLY, 1)


@pytest.mark.parametrize(("requested", "resolved", "support", "decodes"), [
    # The release's own cases stay as they were.
    ("FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE", "UNIFORM_BATCH", "FULL_DECODE_ONLY"),
    ("PIECEWISE", "PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", "NONE"),  # the user asked for no FULL graphs
    ("NONE", "NONE", "UNIFORM_BATCH", "NONE"),
    # A drafter whose attention replays no decode keeps none.
    ("FULL_AND_PIECEWISE", "PIECEWISE", "NEVER", "NONE"),
])
def test_draft_decodes_keep_what_was_asked_and_supported(v033_tree, modes, requested, resolved, support, decodes):
    g = modes.graphs
    managers = _managers_after_resolution(v033_tree, modes, g[requested], g[resolved], modes.support[support])
    assert managers.made[1] == (g[decodes], 1)
    assert not managers.logged
