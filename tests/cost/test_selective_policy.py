"""torchtitan's per-op selective checkpointing ("every_other_matmul"): the bytes the cost model
says a block keeps, against what torch's selective-checkpoint cache holds when torchtitan's
own Llama block runs under torchtitan's own `SelectiveAC`; its recompute time and the
collectives it re-runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import memory
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.spec import Cluster

TORCHTITAN = CostOptions.of(selective_policy="every_other_matmul")


def _saved_under_selective_ac(block, x) -> int:
    """Bytes torch's selective-checkpoint cache holds after `block`'s forward under
    torchtitan's own `SelectiveAC`, plus the block input the checkpoint keeps. On a CPU
    torch's list of compute-intensive ops lacks its CPU flash attention; the policy is given
    it, so the CPU run keeps what a GPU run keeps (CUDA flash attention is on the list)."""
    import torch
    import torchtitan.distributed.activation_checkpoint as ac
    from torch.utils._pytree import tree_leaves

    class CpuSelectiveAC(ac.SelectiveAC):
        def get_save_ops(self):
            return super().get_save_ops() | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    caches = []
    real = ac.create_selective_checkpoint_contexts

    def recording(policy_fn, *args, **kwargs):
        contexts = real(policy_fn, *args, **kwargs)
        caches.append(contexts[0].storage)
        return contexts

    ac.create_selective_checkpoint_contexts = recording
    try:
        block.block = CpuSelectiveAC(ac.SelectiveAC.Config())._wrap_block(block.block)
        out = block(x)
    finally:
        ac.create_selective_checkpoint_contexts = real
    storages = {}
    for by_index in caches[0].values():
        for entry in by_index.values():
            for wrapped in tree_leaves(entry):
                tensor = getattr(wrapped, "val", None)
                if isinstance(tensor, torch.Tensor):
                    storage = tensor.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
    out.sum().backward()  # the policy's recompute gives the same graph back
    assert x.grad is not None
    return sum(storages.values()) + x.numel() * x.element_size()


@pytest.mark.parametrize("tp", [1, 2])
def test_saved_bytes_match_torchtitans_block_under_its_selective_ac(tp):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    from planner.profile.blocks import build_transformer

    spec = resolve_model("tiny-llama")
    mbs, seq = 2, 64
    block = build_transformer("torchtitan", spec, tp, seq, "cpu").to(torch.bfloat16)
    x = torch.randn(mbs, seq, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    measured = _saved_under_selective_ac(block, x)
    expected = memory.activation_bytes(
        spec,
        "transformer",
        Shard(mbs=mbs, seq=seq, tp=tp),
        "selective",
        memory.ActivationOptions(selective_policy="every_other_matmul"),
    )
    # the block input, the fused qkv, gate and down outputs, attention output and log-sum-exp
    assert measured == expected


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b", "gpt3-175b"])
@pytest.mark.parametrize("tp", [1, 8])
def test_policy_sits_between_no_and_full_recompute(model, tp):
    cost = CostModel(resolve_model(model), Cluster.of(resolve_gpu("h100"), 64), TORCHTITAN)
    shard = Shard(mbs=1, seq=4096, tp=tp, sequence_parallel=tp > 1)
    none, op, full = (cost.layer_costs("transformer", shard, mode) for mode in ("none", "selective", "full"))
    assert full.activation_bytes < op.activation_bytes < none.activation_bytes
    assert 0 < op.recompute_s < full.recompute_s
    megatron = CostModel(cost.spec, cost.cluster).layer_costs("transformer", shard, "selective")
    assert megatron.recompute_s < op.recompute_s  # flash attention: Megatron's selective recomputes little


def test_recompute_reruns_the_tensor_parallel_collectives():
    cluster = Cluster.of(resolve_gpu("h100"), 8)
    spec = resolve_model("llama3-8b")
    sp = Shard(mbs=1, seq=8192, tp=8, sequence_parallel=True)
    plain = replace(sp, sequence_parallel=False)
    cost = CostModel(spec, cluster, TORCHTITAN)
    net = cost.network
    act = 2 * sp.local_tokens * spec.hidden_size

    def extra(shard, mode):
        return (
            cost.layer_costs("transformer", shard, mode).comm_backward_s
            - cost.layer_costs("transformer", shard, "none").comm_backward_s
        )

    assert extra(sp, "selective") == pytest.approx(2 * net.all_gather(act, 8, 1))
    assert extra(plain, "selective") == pytest.approx(net.all_reduce(act, 8, 1))
    # full recompute re-runs the forward's collectives: two all-gathers and two reduce-scatters
    assert extra(sp, "full") == pytest.approx(2 * (net.all_gather(act, 8, 1) + net.reduce_scatter(act, 8, 1)))
    # Megatron's core-attention recompute runs no collective
    megatron = CostModel(spec, cluster)
    assert megatron.layer_costs("transformer", sp, "selective").comm_backward_s == pytest.approx(
        megatron.layer_costs("transformer", sp, "none").comm_backward_s
    )


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="selective_policy"):
        CostModel(
            resolve_model("llama3-8b"), Cluster.of(resolve_gpu("h100"), 8), CostOptions.of(selective_policy="layer")
        )


def test_three_qkv_matmuls_keep_q_and_v_under_the_same_policy():
    """torchtitan's 2024 Llama ran wq, wk, wv as three matmuls (torchtitan 9dec370,
    models/llama/model.py: `xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)`): the same
    every-other-matmul policy then keeps q and v, not k. A block of that shape, under
    torchtitan's own SelectiveAC, against `sac_fused_qkv=False`."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    import torch.nn.functional as F
    from torch import nn

    spec = resolve_model("tiny-llama")
    h, heads, kv, d = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.kv_channels

    class Block2024(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.RMSNorm(h), nn.RMSNorm(h)
            self.wq, self.wk = nn.Linear(h, heads * d, bias=False), nn.Linear(h, kv * d, bias=False)
            self.wv, self.wo = nn.Linear(h, kv * d, bias=False), nn.Linear(heads * d, h, bias=False)
            ffn = spec.ffn_hidden_size
            self.w1, self.w2, self.w3 = (
                nn.Linear(h, ffn, bias=False),
                nn.Linear(ffn, h, bias=False),
                nn.Linear(h, ffn, bias=False),
            )

        def forward(self, x):
            b, s, _ = x.shape
            y = self.attention_norm(x)
            xq, xk, xv = self.wq(y), self.wk(y), self.wv(y)
            q = xq.view(b, s, heads, d).transpose(1, 2)
            k = xk.view(b, s, kv, d).repeat_interleave(heads // kv, dim=2).transpose(1, 2)
            v = xv.view(b, s, kv, d).repeat_interleave(heads // kv, dim=2).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
            x = x + self.wo(out)
            z = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(z)) * self.w3(z))

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block2024()

        def forward(self, x):
            return self.block(x)

    mbs, seq = 2, 64
    block = Holder().to(torch.bfloat16)
    x = torch.randn(mbs, seq, h, dtype=torch.bfloat16, requires_grad=True)
    measured = _saved_under_selective_ac(block, x)
    options = memory.ActivationOptions(selective_policy="every_other_matmul", sac_fused_qkv=False)
    expected = memory.activation_bytes(spec, "transformer", Shard(mbs=mbs, seq=seq), "selective", options)
    assert measured == expected
    fused = memory.activation_bytes(
        spec,
        "transformer",
        Shard(mbs=mbs, seq=seq),
        "selective",
        memory.ActivationOptions(selective_policy="every_other_matmul"),
    )
    assert expected < fused  # q and v kept instead of q, k and v
