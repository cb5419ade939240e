"""Tensor and pipeline parallel ranks take the same TurboQuant route (the line's patch 0003), on CPU.

The multi-query route is decided per GPU: tilings probed on the device, the route stepping aside where none
fits. The route sets the builder's reorder threshold (1 + K with the kernel, 1 without) and its CUDA graph
support (UNIFORM_BATCH, or UNIFORM_SINGLE_TOKEN_DECODE), so two ranks of one model that decided differently
would order a batch's tokens differently (their all-reduced activations mixed across requests) and capture
different graph sets, whose collectives no longer pair up. The ranks agree instead: the most conservative
rank's verdict wins, over vLLM's world group (its CPU side), when more than one process runs the model.

Two processes here form a gloo group, each loading the patched backend with a stand-in CUDA device whose
launches the test's probe decides, and vLLM's world group standing for that process group. On one rank the
kernel does not fit the first spec (head size 256): both ranks step aside for it; both take the kernel for a
second spec (head size 128) that fits both.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import tq_harness

import vllm_tree

pytestmark = pytest.mark.patch("turboquant-multi-query-verify-kernel")

VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
HQ, HK = 24, 4
RTX_3090 = (101376, 86, False)
REFUSED = "OutOfResources: out of resource: shared memory"
WORLD = 2
# The rank whose GPU takes no tiling of the first spec.
SMALL_RANK, SMALL_HEAD = 1, 256


def _world_group() -> ModuleType:
    """vllm.distributed.parallel_state with its world group: the default process group, which is gloo here."""
    world = SimpleNamespace(world_size=dist.get_world_size(), cpu_group=dist.group.WORLD)
    module = ModuleType("vllm.distributed.parallel_state")
    module.get_world_group = lambda: world
    return module


def _spec(head_size: int) -> SimpleNamespace:
    return SimpleNamespace(num_kv_heads=HK, head_size=head_size, block_size=16,
                           kv_quant_mode=SimpleNamespace(name="TURBOQUANT_4BIT_NC"))


def _rank(rank: int, tree: str, out: str) -> None:
    """One rank: the route of each spec, as vLLM's model runner asks for it (CUDA graph support, then the
    builder's reorder threshold), and the log lines of the route."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        root = Path(tree)
        mq = vllm_tree.load_module(root, VERIFY)
        stubs = tq_harness.make_stubs(root, tq_harness.Recorder(), mq)
        stubs["vllm.distributed.parallel_state"] = _world_group()
        tq = tq_harness._exec_file(root, tq_harness.TQ, f"_tq_rank_{rank}", stubs)
        torch.cuda.is_available = lambda: True  # a stand-in CUDA device 0 (this process only)
        torch.cuda.current_device = lambda: 0
        tq.tq_mq_device_limits = lambda device: mq.TQMQLimits(*RTX_3090)

        def probe(tiles, **kw):
            return REFUSED if rank == SMALL_RANK and kw["head_dim"] == SMALL_HEAD else None

        tq.tq_mq_verify_probe = probe
        config = tq_harness.vllm_config(3, HQ, 8, 4, 64, dtype=torch.bfloat16, cache_dtype="turboquant_4bit_nc")
        builder = tq.TurboQuantAttentionBackend.get_builder_cls()
        routes = {}
        for head_size in (SMALL_HEAD, 128):
            support = builder.get_cudagraph_support(config, _spec(head_size))
            threshold = builder(_spec(head_size), ["l"], config, "cpu").reorder_batch_threshold
            routes[head_size] = [support.name, threshold]
        # Every rank is still in step: a collective after the route's answers pairs up.
        done = torch.tensor([1])
        dist.all_reduce(done)
        Path(out, f"{rank}.json").write_text(json.dumps({"routes": routes, "log": records,
                                                         "in_step": int(done) == WORLD}))
        dist.barrier()  # neither rank tears the group down while the other still uses it
    finally:
        dist.destroy_process_group()
    # Out without the interpreter's teardown, whose C++ destructors now and then find a thread still joinable
    # and abort ("terminate called without an active exception") after the work is done and written.
    os._exit(0)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch without gloo")
def test_ranks_take_the_most_conservative_route(v033_tree, tmp_path):
    mp.spawn(_rank, args=(str(v033_tree), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(WORLD)]
    assert all(r["in_step"] for r in ranks)
    routes = [r["routes"] for r in ranks]
    assert routes[0] == routes[1], routes
    assert routes[0] == {str(SMALL_HEAD): ["UNIFORM_SINGLE_TOKEN_DECODE", 1], "128": ["UNIFORM_BATCH", 4]}
    # The rank whose GPU fits is told why it steps aside; the agreed route is logged with the rank count.
    fits = ranks[1 - SMALL_RANK]["log"]
    assert any("another rank" in line for line in fits), fits
    assert any(f"on all {WORLD} ranks" in line for line in fits), fits

