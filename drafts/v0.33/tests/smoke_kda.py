import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "kernels"))
import vllm_tree
vllm_tree.AFTER_EXEC["vllm.third_party.flash_linear_attention.ops.op"] = vllm_tree._late_bound_tl_aliases
from pathlib import Path
res = {}
for t in ("pristine", "work"):
    tree = Path("/tmp/v033") / t
    fr = vllm_tree.load_module(tree, "vllm/third_party/flash_linear_attention/ops/fused_recurrent.py")
    import types
    mod = types.SimpleNamespace(fused_recurrent_kda_fwd=vllm_tree.load_function(
        tree, "vllm/third_party/flash_linear_attention/ops/kda.py", "fused_recurrent_kda_fwd",
        torch=torch, fused_recurrent_gated_delta_rule_fwd_kernel=fr.fused_recurrent_gated_delta_rule_fwd_kernel,
        next_power_of_2=lambda n: 1 << (n - 1).bit_length(), cdiv=lambda a, b: -(-a // b)))
    g = torch.Generator().manual_seed(0)
    H = HV = 2; K = V = 16; n = 2; T = 3
    q = torch.randn(1, n*T, H, K, generator=g); k = torch.randn(1, n*T, H, K, generator=g)
    v = torch.randn(1, n*T, HV, V, generator=g); gk = -torch.rand(1, n*T, HV, K, generator=g)
    beta = torch.rand(1, n*T, HV, generator=g)
    state = torch.randn(8, HV, V, K, generator=g) * 0.1
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    cu = torch.tensor([0, T, 2*T], dtype=torch.int32)
    acc = torch.tensor([2, 3], dtype=torch.int32)
    o, s = mod.fused_recurrent_kda_fwd(q=q, k=k, v=v, g=gk, beta=beta, scale=K**-0.5, initial_state=state,
        inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx, num_accepted_tokens=acc,
        use_qk_l2norm_in_kernel=True)
    res[t] = (o.clone(), s.clone())
print("kda spec path identical:", torch.equal(res["pristine"][0], res["work"][0]) and torch.equal(res["pristine"][1], res["work"][1]))
