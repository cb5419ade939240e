"""Source checks of the patched ``turboquant_attn.py`` (no import of vllm, no kernel run).

What patches 0001 and 0002 promise that the code's shape shows: it compiles; ``forward`` and the attention
paths read no device tensor on the host (every ``.tolist()``/``.item()`` is on a CPU mirror, and the only
device-to-host copies are fallbacks that refuse to run under stream capture); the per-request loop is
guarded; the routed spec-verify branch writes into the layer's ``output`` and passes the layer's decode
buffers; and the builder's CUDA graph support is what each step of the series needs.
"""

from __future__ import annotations

import ast
import py_compile
from pathlib import Path

import pytest

# Every test reads a real tree, fetched by name at run time (`_tree`), which the collection hook in
# tests/conftest.py cannot see: so the module says it.
pytestmark = [pytest.mark.integration, pytest.mark.patch(
    "turboquant-capture-safe-continuation-prefill",
    "turboquant-route-spec-verify-batches-through-decode-kernel",
)]

BACKEND = "vllm/v1/attention/backends/turboquant_attn.py"
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
ATTENTION_PATHS = ("forward", "_prefill_attention", "_spec_verify_attention", "_decode_attention")
HOST_READS = {"tolist", "item", "cpu", "numpy"}


def _tree(name, request) -> Path:
    return request.getfixturevalue(f"{name}_tree")


def _module(tree: Path) -> ast.Module:
    return ast.parse((tree / BACKEND).read_text())


def _class(mod: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"no class {name}"
    return found[0]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"no method {cls.name}.{name}"
    return found[0]


def _impl(tree: Path) -> ast.ClassDef:
    return _class(_module(tree), "TurboQuantAttentionImpl")


def _calls(node: ast.AST):
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _attr_calls(node: ast.AST, attrs: set[str]):
    return [c for c in _calls(node) if isinstance(c.func, ast.Attribute) and c.func.attr in attrs]


def _named_calls(node: ast.AST, name: str):
    return [c for c in _calls(node)
            if (isinstance(c.func, ast.Name) and c.func.id == name)
            or (isinstance(c.func, ast.Attribute) and c.func.attr == name)]


@pytest.mark.parametrize("which", ["patch1", "patched"])
@pytest.mark.parametrize("rel", [BACKEND, DECODE])
def test_patched_files_compile(which, rel, request, tmp_path):
    py_compile.compile(str(_tree(which, request) / rel), cfile=str(tmp_path / "out.pyc"), doraise=True)


def _host_read_violations(tree: Path) -> list[str]:
    impl = _impl(tree)
    bad = []
    for name in ATTENTION_PATHS:
        if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in impl.body):
            continue  # _spec_verify_attention exists from patch 0002 on
        for call in _attr_calls(_method(impl, name), HOST_READS):
            receiver = ast.unparse(call.func.value)
            # Allowed: CPU mirrors (*_cpu names) and what the _host_* helpers return.
            on_host = "_cpu" in receiver or receiver.startswith("self._host_")
            if call.func.attr in ("cpu", "numpy") or not on_host:
                bad.append(f"{name}:{call.lineno}: {ast.unparse(call)}")
    return bad


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_no_host_read_of_device_tensors(which, request):
    assert _host_read_violations(_tree(which, request)) == []


def test_pristine_reads_device_tensors_on_host(pristine_tree):
    """The check above is meaningful: v0.20.0 fails it (the syncs of vllm#40807)."""
    bad = _host_read_violations(pristine_tree)
    assert any("query_start_loc.tolist()" in b for b in bad), bad
    assert any("seq_lens" in b and ".tolist()" in b for b in bad), bad


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_host_copy_fallbacks_refuse_capture(which, request):
    """The only device-to-host copies left (mirror missing) first refuse to run under stream capture."""
    impl = _impl(_tree(which, request))
    helpers = [n for n in impl.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_host_")]
    assert {h.name for h in helpers} == {"_host_query_start_loc", "_host_seq_lens"}
    for helper in helpers:
        copies = _attr_calls(helper, {"cpu", "tolist", "item", "numpy"})
        guards = _named_calls(helper, "_raise_if_capturing")
        assert copies and guards, helper.name
        assert min(g.lineno for g in guards) < min(c.lineno for c in copies), helper.name


@pytest.mark.parametrize("which", ["patch1", "patched"])
def test_per_request_loop_refuses_capture(which, request):
    prefill = _method(_impl(_tree(which, request)), "_prefill_attention")
    loops = [n for n in ast.walk(prefill) if isinstance(n, ast.For) and "range(num_reqs)" in ast.unparse(n.iter)]
    guards = _named_calls(prefill, "_raise_if_capturing")
    assert len(loops) == 1 and guards
    assert max(g.lineno for g in guards) < loops[0].lineno
    # The flash fast path (a graph-safe launch) stays before the guard.
    fast = [n for n in ast.walk(prefill) if isinstance(n, ast.If) and "first_chunk_only" in ast.unparse(n.test)]
    assert fast and fast[-1].lineno < min(g.lineno for g in guards)


def test_routed_branch_writes_into_output(patched_tree):
    forward = _method(_impl(patched_tree), "forward")
    branches = [n for n in ast.walk(forward) if isinstance(n, ast.If) and ast.unparse(n.test) == "spec_k1"]
    assert len(branches) == 1
    branch = branches[0]
    assert any(isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "attn_out"
               and "self._spec_verify_attention(" in ast.unparse(s.value) for s in branch.body)
    # The chain continues with the original dispatch, so every branch reaches the common tail.
    assert branch.orelse and isinstance(branch.orelse[0], ast.If)
    assert ast.unparse(branch.orelse[0].test) == "not attn_metadata.is_prefill"
    # The tail writes attn_out into the layer's output buffer (the caller ignores the return value).
    tail = [s for s in ast.walk(forward) if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "output[:N]"]
    assert tail and all("attn_out" in ast.unparse(s.value) for s in tail)
    assert all(s.lineno > branch.lineno for s in tail)
    returns = [ast.unparse(r.value) for r in ast.walk(forward) if isinstance(r, ast.Return)]
    assert returns and all(r.startswith("output") for r in returns), returns
    # Routed before anything else: the predicate is computed from host values of the metadata.
    pred = _named_calls(forward, "tq_spec_verify_query_len")
    assert len(pred) == 1 and {k.arg for k in pred[0].keywords} >= {
        "is_prefill", "num_decodes", "max_query_len", "num_tokens", "num_reqs", "graph_query_len"}


def test_routed_call_reuses_layer_decode_buffers(patched_tree):
    impl = _impl(patched_tree)
    routed = _method(impl, "_spec_verify_attention")
    launches = _named_calls(routed, "triton_turboquant_decode_attention")
    assert len(launches) == 1
    kw = {k.arg: ast.unparse(k.value) for k in launches[0].keywords}
    assert kw["max_num_kv_splits"] == "self.max_num_kv_splits"
    assert kw["mid_o_buf"] == "mid_o_buf" and kw["output_buf"] == "output_buf" and kw["lse_buf"] == "lse_buf"
    # Never replaced from here: the buffers are sized at model init for every verify batch, and one allocated
    # during graph capture would come from the graph pool (see test_decode_buffers_hold_every_verify_batch).
    assert kw["buf_holder"] == "None"
    assert kw["block_table"] == "block_table" and kw["seq_lens"] == "seq_lens"
    src = ast.unparse(routed)
    for attr in ("_tq_mid_o_buf", "_tq_output_buf", "_tq_lse_buf"):
        assert f"getattr(layer, '{attr}', None)" in src
    # The same attributes as the decode path: one set of buffers per layer.
    decode_src = ast.unparse(_method(impl, "_decode_attention"))
    for attr in ("_tq_mid_o_buf", "_tq_output_buf", "_tq_lse_buf"):
        assert f"getattr(layer, '{attr}', None)" in decode_src
    # Built from the ops helpers (unit-tested with the kernels), cached on the metadata for the step.
    assert _named_calls(routed, "tq_spec_verify_block_table") and _named_calls(routed, "tq_spec_verify_seq_lens")
    assert "attn_metadata.spec_verify_inputs = inputs" in src


def _cg_support(tree: Path) -> str:
    builder = _class(_module(tree), "TurboQuantMetadataBuilder")
    for node in builder.body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "_cudagraph_support":
            return ast.unparse(node.value)
    raise AssertionError("no _cudagraph_support")


def test_cudagraph_support_per_step(pristine_tree, patch1_tree, patched_tree):
    # v0.20.0: UNIFORM_BATCH with a path that cannot be captured (vllm#40807).
    assert _cg_support(pristine_tree) == "AttentionCGSupport.UNIFORM_BATCH"
    # Patch 0001 alone: K+1 batches stay out of FULL graphs (vLLM falls back to PIECEWISE with spec decode).
    assert _cg_support(patch1_tree) == "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE"
    # Patch 0002: K+1 batches are routed, FULL graphs again.
    assert _cg_support(patched_tree) == "AttentionCGSupport.UNIFORM_BATCH"
    builder = _class(_module(patched_tree), "TurboQuantMetadataBuilder")
    getter = ast.unparse(_method(builder, "get_cudagraph_support"))
    assert "_SPEC_VERIFY_MAX_QUERY_LEN" in getter and "UNIFORM_SINGLE_TOKEN_DECODE" in getter


def _env_default(tree: Path, name: str) -> str | None:
    """The default of an ``env_with_choices(NAME, DEFAULT, ...)`` entry of ``vllm/envs.py``."""
    for node in ast.walk(ast.parse((tree / "vllm/envs.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "env_with_choices" \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == name:
            return node.args[1].value
    return None


def test_the_multi_query_kernel_is_the_default_and_the_stand_in_envs_agree(patched_tree, pristine_tree):
    from tq_backend import _Settings

    assert _env_default(pristine_tree, "VLLM_TURBOQUANT_ATTENTION_KERNEL") is None
    default = _env_default(patched_tree, "VLLM_TURBOQUANT_ATTENTION_KERNEL")
    assert default == "multi_query"
    assert _Settings().attention_kernel == default, "the vllm.envs stand-in must default like vLLM"
