"""Full recompute under torch's non-reentrant checkpoint (`CostOptions.recompute.recompute_early_stop`):
counted on torch's own `torch.utils.checkpoint` on CPU, against what the cost model charges."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard, transformer_gemms
from planner.spec import Cluster

torch = pytest.importorskip("torch")

DIM, FFN, HEADS = 32, 64, 4


def _block():
    """A Llama-style block: RMSNorm, q/k/v/o projections around SDPA, RMSNorm, SwiGLU MLP
    (gate, up, down), two residual adds."""
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
            self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
            self.gate, self.up = nn.Linear(DIM, FFN, bias=False), nn.Linear(DIM, FFN, bias=False)
            self.down = nn.Linear(FFN, DIM, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            h = self.norm1(x)
            q, k, v = (p(h).view(b, s, HEADS, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, DIM)
            x = x + self.o(a)
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    return Block()


def _matmuls_in_backward(**checkpoint_kwargs) -> int:
    """Matmul kernels (mm, bmm, addmm) torch runs in one checkpointed block's backward."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    kinds = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.matmuls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.matmuls += func in kinds
            return func(*args, **(kwargs or {}))

    block = _block()
    x = torch.randn(2, 8, DIM, requires_grad=True)
    out = checkpoint(block, x, **checkpoint_kwargs)
    with Count() as counter:
        out.sum().backward()
    return counter.matmuls


def test_non_reentrant_checkpoint_skips_only_the_last_matmul():
    """7 projections: the backward runs 2 x 7 gradient matmuls plus the recomputed forward's;
    the reentrant checkpoint (Megatron-LM's and DeepSpeed's kind) re-runs all 7, torch's
    non-reentrant one with its default early stop all but the down projection, whose output
    nothing saves."""
    grads = 2 * 7
    assert _matmuls_in_backward(use_reentrant=True) == grads + 7
    assert _matmuls_in_backward(use_reentrant=False, early_stop=False) == grads + 7
    assert _matmuls_in_backward(use_reentrant=False) == grads + 6


def test_model_leaves_out_the_down_projection_and_its_collective():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 8)
    base = CostOptions()
    on = CostModel(spec, cluster, base.with_fields(recompute_early_stop=True))
    off = CostModel(spec, cluster, base)
    for shard in (
        Shard(mbs=2, seq=4096, tp=8, sequence_parallel=True),
        Shard(mbs=2, seq=4096, tp=8),
        Shard(mbs=1, seq=4096),
    ):
        down = transformer_gemms(spec, shard)[-1]
        assert down.name == "mlp_down"
        gemm = on.analytic.gemm_time(down.m, down.n, down.k)
        with_stop, full = on.layer_costs("transformer", shard, "full"), off.layer_costs("transformer", shard, "full")
        assert full.recompute_s - with_stop.recompute_s == pytest.approx(gemm)
        act = on.dtype_bytes * shard.local_tokens * spec.hidden_size
        if shard.tp == 1:
            collective = 0.0
        elif shard.sequence_parallel:
            collective = on.network.reduce_scatter(act, shard.tp, 1)
        else:
            collective = on.network.all_reduce(act, shard.tp, 1)
        assert full.comm_backward_s - with_stop.comm_backward_s == pytest.approx(collective)
        # selective recompute and the forward are untouched
        assert on.layer_costs("transformer", shard, "selective") == off.layer_costs("transformer", shard, "selective")
        assert with_stop.forward_s == full.forward_s


def test_moe_blocks_recompute_their_whole_forward():
    """The router's weights scale the experts' output, so the experts run again: no saving."""
    spec = resolve_model("qwen3-235b-a22b")
    cluster = Cluster.of(resolve_gpu("h100"), 64)
    shard = Shard(mbs=1, seq=4096, tp=2, sequence_parallel=True, ep=8, etp=1)
    on = CostModel(spec, cluster, CostOptions.of(recompute_early_stop=True))
    off = CostModel(spec, cluster, CostOptions())
    assert on.layer_costs("transformer", shard, "full") == off.layer_costs("transformer", shard, "full")
