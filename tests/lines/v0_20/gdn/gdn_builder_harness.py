"""Run vLLM's ``GDNAttentionMetadataBuilder.build`` on CPU without importing the ``vllm`` package.

``vllm/v1/attention/backends/gdn_attn.py`` imports the config system, the attention backend base classes
and ``backends/utils.py``, which pull in the whole GPU stack. ``load_gdn_attn`` runs the file's own
source instead, with its ``vllm.*`` imports answered by small stand-ins:

- the two helpers the builder relies on, ``split_decodes_and_prefills`` and
  ``mamba_get_block_table_tensor``, are the tree's own functions, cut out of ``backends/utils.py``
  with ``ast``;
- the base classes and enums become minimal classes; ``compute_causal_conv1d_metadata`` and the FLA
  chunk helpers, which only feed the kernels, become stubs.

The builder itself, its ``__init__`` and ``build``, runs unchanged. ``make_builder`` gives it a
duck-typed config, and ``Batch`` gives it a ``CommonAttentionMetadata`` of the fields ``build`` reads.
On a GPU host the same cases run against the real module (``test_gdn_builder_gpu.py``).
"""

from __future__ import annotations
import __future__

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Generic, TypeVar

import torch

GDN_ATTN = "vllm/v1/attention/backends/gdn_attn.py"
BACKEND_UTILS = "vllm/v1/attention/backends/utils.py"

_T = TypeVar("_T")


class _MetadataBuilder(Generic[_T]):
    """Stands in for ``AttentionMetadataBuilder``: the one base method ``GDNAttentionMetadataBuilder`` calls."""

    def _init_reorder_batch_threshold(self, reorder_batch_threshold=1, supports_spec_as_decode=False,
                                      supports_dcp_with_varlen=False) -> None:
        self.reorder_batch_threshold = reorder_batch_threshold


class MambaSpec:
    """Stands in for ``vllm.v1.kv_cache_interface.MambaSpec`` (only its type is checked in mode "none")."""

    block_size = 16
    num_speculative_blocks = 0


def _cut_functions(path: Path, names: set[str], namespace: dict) -> None:
    """Define the top-level functions ``names`` of the file ``path`` in ``namespace`` (annotations unevaluated)."""
    tree = ast.parse(path.read_text(), str(path))
    wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    missing = names - {node.name for node in wanted}
    if missing:
        raise LookupError(f"{path}: no top-level function {sorted(missing)}")
    module = ast.Module(body=wanted, type_ignores=[])
    code = compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)


def _stubs(tree: Path) -> dict[str, ModuleType]:
    utils = ModuleType("vllm.v1.attention.backends.utils")
    namespace = {"torch": torch, "MambaSpec": MambaSpec, "__name__": utils.__name__}
    _cut_functions(tree / BACKEND_UTILS, {"split_decodes_and_prefills", "mamba_get_block_table_tensor"}, namespace)
    utils.split_decodes_and_prefills = namespace["split_decodes_and_prefills"]
    utils.mamba_get_block_table_tensor = namespace["mamba_get_block_table_tensor"]
    utils.NULL_BLOCK_ID = 0
    utils.compute_causal_conv1d_metadata = lambda query_start_loc_cpu, device: (None, None, None)

    def module(name: str, **attrs) -> ModuleType:
        mod = ModuleType(name)
        mod.__dict__.update(attrs)
        return mod

    def chunks(cu_seqlens, chunk_size):
        return torch.zeros(0, dtype=torch.int32)

    return {
        "vllm.config": module("vllm.config", VllmConfig=object),
        "vllm.v1.attention.backend": module(
            "vllm.v1.attention.backend", AttentionBackend=object, AttentionMetadataBuilder=_MetadataBuilder,
            AttentionCGSupport=SimpleNamespace(UNIFORM_BATCH="UNIFORM_BATCH"), CommonAttentionMetadata=object),
        "vllm.v1.attention.backends.utils": utils,
        "vllm.v1.kv_cache_interface": module("vllm.v1.kv_cache_interface", AttentionSpec=object, MambaSpec=MambaSpec),
        "vllm.model_executor.layers.fla.ops.index": module(
            "vllm.model_executor.layers.fla.ops.index", prepare_chunk_indices=chunks, prepare_chunk_offsets=chunks),
        "vllm.model_executor.layers.fla.ops.utils": module("vllm.model_executor.layers.fla.ops.utils",
                                                           FLA_CHUNK_SIZE=64),
    }


def load_gdn_attn(tree: Path) -> ModuleType:
    """The tree's ``gdn_attn.py`` as a module, run with stand-ins for its ``vllm.*`` imports."""
    stubs = _stubs(tree)

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "vllm" or name.startswith("vllm.")):
            if name not in stubs or not fromlist:
                raise ImportError(f"gdn_builder_harness has no stand-in for {name!r}")
            return stubs[name]
        return builtins.__import__(name, globals, locals, fromlist, level)

    path = tree / GDN_ATTN
    module = ModuleType("_gdn_attn_under_test")
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import}
    exec(compile(path.read_text(), str(path), "exec", dont_inherit=True), module.__dict__)
    return module


def make_builder(gdn_attn, num_spec: int, device: str = "cpu", mamba_spec=None, full_cuda_graph: bool = False,
                 max_num_seqs: int = 16):
    """A ``GDNAttentionMetadataBuilder`` (its own ``__init__``) for ``num_spec`` draft tokens, mode "none"."""

    class _CGMode:
        def has_full_cudagraphs(self) -> bool:
            return full_cuda_graph

    config = SimpleNamespace(
        compilation_config=SimpleNamespace(cudagraph_mode=_CGMode(), max_cudagraph_capture_size=None),
        speculative_config=(SimpleNamespace(num_speculative_tokens=num_spec, parallel_drafting=False)
                            if num_spec else None),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        cache_config=SimpleNamespace(mamba_cache_mode="none"),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )
    spec = mamba_spec if mamba_spec is not None else MambaSpec()
    return gdn_attn.GDNAttentionMetadataBuilder(spec, ["layer.0"], config, torch.device(device))


@dataclass
class Batch:
    """The ``CommonAttentionMetadata`` fields ``build`` reads, from per-row query lengths and contexts.

    Rows are in the runner's batch order. ``block_table`` row r is ``[100 r, 100 r + 1, ...]``, so a block
    id names its row and column.
    """

    query_lens: list[int]
    context_lens: list[int]
    prefilling: list[bool]
    num_spec: int
    device: str = "cpu"

    def __post_init__(self) -> None:
        n = len(self.query_lens)
        qsl = [0]
        for q in self.query_lens:
            qsl.append(qsl[-1] + q)
        self.query_start_loc_cpu = torch.tensor(qsl, dtype=torch.int32)
        self.query_start_loc = self.query_start_loc_cpu.to(self.device)
        seq_lens = [c + q for c, q in zip(self.context_lens, self.query_lens, strict=True)]
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=self.device)
        cols = self.num_spec + 1
        self.block_table_tensor = (torch.arange(n, dtype=torch.int32)[:, None] * 100
                                   + torch.arange(cols, dtype=torch.int32)[None, :]).to(self.device)
        self.num_reqs = n
        self.num_actual_tokens = qsl[-1]
        self.max_query_len = max(self.query_lens) if self.query_lens else 0
        self.is_prefilling = torch.tensor(self.prefilling, dtype=torch.bool)
        self.slot_mapping = torch.zeros(qsl[-1], dtype=torch.int64, device=self.device)

    def compute_num_computed_tokens(self) -> torch.Tensor:
        return self.seq_lens - (self.query_start_loc[1:] - self.query_start_loc[:-1])

    def block(self, row: int, col: int) -> int:
        return 100 * row + col
