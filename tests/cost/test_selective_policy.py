"""torchtitan's per-op selective checkpointing ("every_other_matmul"): the bytes the cost model
says a block keeps, against what torch's own selective-checkpoint machinery caches when run
with torchtitan's policy; its recompute time and the collectives it re-runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import memory
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.spec import Cluster

TORCHTITAN = CostOptions(selective_policy="every_other_matmul")


def _torchtitan_policy(save_ops, mm_ops, kept: list[int]):
    """torchtitan's SelectiveAC rule: save the listed compute ops' outputs, except every
    second matmul of the block, and recompute everything else. Appends the bytes of each
    output it saves in the forward to `kept`."""
    import torch
    from torch.utils._pytree import tree_leaves
    from torch.utils.checkpoint import CheckpointPolicy

    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            count[mode] += 1
        if func in save_ops and not (func in mm_ops and count[mode] % 2 == 0):
            if not ctx.is_recompute:
                kept.extend(t.numel() * t.element_size() for t in tree_leaves(ctx.op_output)
                            if isinstance(t, torch.Tensor))
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])
def test_saved_bytes_match_what_torch_caches_under_the_policy(model):
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from planner.profile.measure import build_layer

    spec = resolve_model(model)
    mbs, seq = 2, 64
    aten = torch.ops.aten
    mm_ops = {aten.mm.default, aten.addmm.default}
    save_ops = mm_ops | {aten._scaled_dot_product_flash_attention_for_cpu.default,
                         aten._scaled_dot_product_efficient_attention.default,
                         aten._scaled_dot_product_flash_attention.default}
    kept: list[int] = []
    policy = _torchtitan_policy(save_ops, mm_ops, kept)
    block = build_layer(spec, "transformer", 1, seq, "cpu").to(torch.bfloat16)
    x = torch.randn(mbs, seq, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    out = checkpoint(block, x, use_reentrant=False,
                     context_fn=lambda: create_selective_checkpoint_contexts(policy))
    measured = sum(kept) + x.numel() * x.element_size()  # the checkpoint keeps its input
    expected = memory.activation_bytes(spec, "transformer", Shard(mbs=mbs, seq=seq, tp=1), "selective",
                                       memory.ActivationOptions(selective_policy="every_other_matmul"))
    assert expected == pytest.approx(measured, rel=0.03)
    out.sum().backward()  # the policy's recompute gives the same graph back
    assert x.grad is not None


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
        return (cost.layer_costs("transformer", shard, mode).comm_backward_s
                - cost.layer_costs("transformer", shard, "none").comm_backward_s)

    assert extra(sp, "selective") == pytest.approx(2 * net.all_gather(act, 8, 1))
    assert extra(plain, "selective") == pytest.approx(net.all_reduce(act, 8, 1))
    # full recompute re-runs the forward's collectives: two all-gathers and two reduce-scatters
    assert extra(sp, "full") == pytest.approx(2 * (net.all_gather(act, 8, 1) + net.reduce_scatter(act, 8, 1)))
    # Megatron's core-attention recompute runs no collective
    megatron = CostModel(spec, cluster)
    assert megatron.layer_costs("transformer", sp, "selective").comm_backward_s == pytest.approx(
        megatron.layer_costs("transformer", sp, "none").comm_backward_s)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="selective_policy"):
        CostModel(resolve_model("llama3-8b"), Cluster.of(resolve_gpu("h100"), 8),
                  CostOptions(selective_policy="layer"))
