"""Where the GDN layers of a speculative step continue each request's recurrent state from, decided by a tree's own
Model Runner V1 and GDN metadata builder (lines v0.25 and v0.27, patch 0006).

A verify step writes one GDN state per token into the request's state slots (columns of its mamba block table);
the state after the last accepted token is in column ``num_accepted_tokens - 1``. The next step must start there.
Only the builder's speculative path hands the kernels ``num_accepted_tokens`` and the row's slots (the kernels
read the initial state at ``ssm_state_indices[n, num_accepted_tokens[n] - 1]``,
``fused_recurrent.py``/``fused_sigmoid_gating.py``); its plain path hands ``block_table[:, 0]``. So a decode that
got no drafts must still be a speculative row with zero drafts.

Both pieces are cut out of the tree's files with ``ast`` (they cannot be imported without vLLM's compiled parts)
and run on stand-ins that hold only data:

- the runner's statements of ``_prepare_inputs`` from ``use_spec_decode = ...`` through the branch that fills
  ``num_decode_draft_tokens``: which rows the builder receives as speculative rows (drafts, 0 for none) and
  which as plain rows (-1), or none at all when the step does not take the speculative path;
- ``GDNAttentionMetadataBuilder.build``: the state slot each row starts from.

On the release (0.25.1, 0.27.1), Model Runner V1 (the hybrids' default) takes the speculative path only in steps
where some request has drafts (``use_spec_decode = len(scheduled_spec_decode_tokens) > 0``), marks decodes
without drafts -1 (plain rows), and the GDN builder runs a step whose rows drafted nothing as a plain batch; both
send such rows to ``block_table[:, 0]``, a stale state whenever the previous step accepted more than one token.
Ngram leaves rows and whole steps without drafts whenever the prompt has no match.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import tq_harness

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
GDN_ATTN = "vllm/v1/attention/backends/gdn_attn.py"
UTILS = "vllm/v1/attention/backends/utils.py"


def _prepare_inputs_routing(tree: Path) -> ast.Module:
    """``use_spec_decode = ...`` and the ``if not use_spec_decode:`` statement after it, from ``_prepare_inputs``."""
    path = tree / RUNNER
    source = ast.parse(path.read_text(), str(path))
    cls = next(n for n in ast.walk(source) if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_prepare_inputs")
    body = fn.body
    start = next(i for i, s in enumerate(body) if isinstance(s, ast.Assign)
                 and [getattr(t, "id", None) for t in s.targets] == ["use_spec_decode"])
    end = next(i for i in range(start + 1, len(body)) if isinstance(body[i], ast.If)
               and "use_spec_decode" in ast.unparse(body[i].test))
    return ast.Module(body=body[start:end + 1], type_ignores=[])


def spec_rows(tree: Path, scheduled: list[int], drafts: dict[int, int], computed: list[int], prompt: list[int],
              num_spec: int) -> list[int] | None:
    """What the tree's V1 runner gives the GDN builder for one step: per row, its draft count (a speculative row)
    or -1 (a plain row); None when the step does not take the speculative path (the builder then gets no draft
    counts and runs every row as a plain one). ``scheduled``: tokens per row; ``drafts``: row -> drafts scheduled
    (absent: none); ``computed``/``prompt``: tokens computed so far and prompt length, per row."""
    num_reqs = len(scheduled)
    buffer = SimpleNamespace(np=np.full(num_reqs + 4, -7, dtype=np.int32), copy_to_gpu=lambda *a: None)
    ids = [f"r{i}" for i in range(num_reqs)]
    runner = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=num_spec),
        input_batch=SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(ids)},
                                    num_computed_tokens_cpu=np.array(computed, dtype=np.int32),
                                    num_prompt_tokens=np.array(prompt, dtype=np.int32)),
        num_decode_draft_tokens=buffer,
        _calc_spec_decode_metadata=lambda num_draft_tokens, cu_num_tokens: SimpleNamespace(logits_indices=None),
    )
    num_scheduled = np.array(scheduled, dtype=np.int32)
    cu = np.cumsum(num_scheduled)
    scope: dict[str, Any] = {
        "self": runner, "np": np, "num_reqs": num_reqs, "num_scheduled_tokens": num_scheduled,
        "cu_num_tokens": cu, "query_start_loc": torch.tensor(np.concatenate([[0], cu])),
        "scheduler_output": SimpleNamespace(scheduled_spec_decode_tokens={ids[i]: [0] * n for i, n in drafts.items()},
                                            total_num_scheduled_tokens=int(cu[-1])),
    }
    exec(compile(ast.fix_missing_locations(_prepare_inputs_routing(tree)), str(tree / RUNNER), "exec"), scope)
    if not scope["use_spec_decode"]:
        return None
    return [int(v) for v in buffer.np[:num_reqs]]


def _builder(tree: Path, num_spec: int) -> Any:
    """The tree's ``build`` bound to a builder that holds only what it reads (speculation on, no FULL graphs)."""
    utils = {name: tq_harness.tree_class(tree, UTILS, name, torch=torch, MambaSpec=object)
             for name in ("mamba_get_block_table_tensor", "split_decodes_and_prefills")}
    metadata = tq_harness.tree_class(tree, GDN_ATTN, "GDNAttentionMetadata", dataclass=dataclasses.dataclass,
                                     torch=torch)
    build = tq_harness.tree_class(
        tree, GDN_ATTN, "GDNAttentionMetadataBuilder.build", torch=torch, GDNAttentionMetadata=metadata,
        CommonAttentionMetadata=object, async_tensor_h2d=lambda t, device: t.to(device),
        compute_causal_conv1d_metadata=None, **utils)
    builder = SimpleNamespace(
        use_spec_decode=num_spec > 0, num_spec=num_spec, kv_cache_spec=None, use_full_cuda_graph=False,
        decode_cudagraph_max_bs=0, gdn_prefill_backend="triton",
        vllm_config=SimpleNamespace(cache_config=SimpleNamespace(mamba_cache_mode="none")))
    return build.__get__(builder)


def start_slots(tree: Path, rows: list[int] | None, accepted: list[int], num_spec: int) -> list[int]:
    """The state slot each one-token decode row starts from, by the tree's GDN builder: ``rows`` is what the
    runner gave it (``spec_rows``), ``accepted`` each row's accepted tokens of the previous step. Slots are
    numbered ``10 * row + column`` of a block table with 1 + num_spec columns."""
    n = len(accepted)
    cam = tq_harness.cam_class(tree)
    fields = {f.name for f in dataclasses.fields(cam)}
    qsl = torch.arange(n + 1, dtype=torch.int32)
    values = dict(query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=torch.full((n,), 40, dtype=torch.int32),
                  num_reqs=n, num_actual_tokens=n, max_query_len=1, max_seq_len=40,
                  block_table_tensor=torch.tensor([[10 * r + c for c in range(num_spec + 1)] for r in range(n)],
                                                  dtype=torch.int32),
                  slot_mapping=torch.zeros(n, dtype=torch.int64), causal=True,
                  seq_lens_cpu=torch.full((n,), 40, dtype=torch.int32),
                  num_computed_tokens_cpu=torch.full((n,), 39, dtype=torch.int32),
                  _seq_lens_cpu=torch.full((n,), 40, dtype=torch.int32),
                  _num_computed_tokens_cpu=torch.full((n,), 39, dtype=torch.int32),
                  seq_lens_cpu_upper_bound=torch.full((n,), 40, dtype=torch.int32))
    m = cam(**{k: v for k, v in values.items() if k in fields})
    counts = None if rows is None else torch.tensor(rows, dtype=torch.int32)
    meta = _builder(tree, num_spec)(0, m, num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32),
                                    num_decode_draft_tokens_cpu=counts)
    if meta.spec_state_indices_tensor is None:  # the plain path: the kernels start from these slots
        return [int(s) for s in meta.non_spec_state_indices_tensor[:n]]
    assert meta.num_prefills == 0 and meta.num_decodes == 0, meta
    return [int(meta.spec_state_indices_tensor[i, int(meta.num_accepted_tokens[i]) - 1]) for i in range(n)]


K = 3


# The tests, collected where a line's test module imports them; ``tree`` is that module's fixture: the line's
# patched tree, or the release's to show them failing.


def test_runner_keeps_decodes_without_drafts_on_the_speculative_path(tree: Path) -> None:
    # A step in which no request got drafts (ngram found no match): three decodes.
    assert spec_rows(tree, [1, 1, 1], {}, computed=[50, 60, 70], prompt=[40, 40, 40], num_spec=K) == [0, 0, 0]
    # A mixed step: a verify row with 2 drafts, a decode without, a prompt chunk, a prompt's last token.
    assert spec_rows(tree, [3, 1, 5, 1], {0: 2}, computed=[50, 60, 10, 39], prompt=[40, 40, 40, 40],
                     num_spec=K) == [2, 0, -1, -1]


def test_gdn_starts_decodes_without_drafts_from_the_accepted_state(tree: Path) -> None:
    rows = spec_rows(tree, [1, 1, 1], {}, computed=[50, 60, 70], prompt=[40, 40, 40], num_spec=K)
    # The previous verify step accepted 3, 1 and 2 tokens: columns 2, 0 and 1 of rows 0, 1 and 2.
    assert start_slots(tree, rows, accepted=[3, 1, 2], num_spec=K) == [2, 10, 21]


def test_gdn_runs_a_step_of_zero_draft_rows_on_the_speculative_path(tree: Path) -> None:
    # The builder's half alone: given zero-draft rows, a step in which no row drafted is still a speculative step.
    assert start_slots(tree, [0, 0, 0], accepted=[3, 1, 2], num_spec=K) == [2, 10, 21]
