"""The loss's HBM traffic per logit element (planner/cost/shapes.py `VOCAB_PARALLEL_CE_BYTES`),
counted op by op on Megatron's own vocab-parallel cross-entropy.

megatron-core's `VocabParallelCrossEntropy` keeps the 2021 `_VocabParallelCrossEntropy`'s op
sequence as static steps (no process group needed): the steps are run for real on CPU, from
16-bit logits to the 16-bit gradient the `.float()` cast's backward returns, under a dispatch
mode that adds, per aten op, the bytes of the logit-sized tensors it reads and writes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.model import AnalyticSource, CostOptions
from planner.cost.shapes import FUSED_CE_BYTES, VOCAB_PARALLEL_CE_BYTES, Shard, layer_work

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as VPCE

NO_TRAFFIC = {
    "view",
    "_unsafe_view",
    "unsqueeze",
    "alias",
    "detach",
    "index",
    "index_put",
    "index_put_",
    "_index_put_impl_",
    "expand",
}
"""Views move no bytes; the indexed gather and scatter touch one element per token."""


class LogitTraffic(TorchDispatchMode):
    """Bytes read and written by each op on tensors with `numel` elements (the logits)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.nbytes = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket.__name__ not in NO_TRAFFIC:
            reads = [t for t in tree_leaves((args, {k: v for k, v in kwargs.items() if k != "out"}))]
            for t in reads + list(tree_leaves(out)):
                if isinstance(t, torch.Tensor) and t.numel() == self.numel:
                    self.nbytes += t.numel() * t.element_size()
        return out


def measured_bytes_per_logit(tokens: int = 64, vocab: int = 512) -> tuple[float, float]:
    """Forward and backward bytes per logit element of Megatron's loss on 16-bit logits."""
    torch.manual_seed(0)
    logits = torch.randn(tokens, vocab).to(torch.float16)
    target = torch.randint(0, vocab, (tokens,))
    with LogitTraffic(tokens * vocab) as fwd:
        fp32, logits_max = VPCE.calculate_logits_max(logits)
        mask, target_1d, predicted, sum_exp, exp = VPCE.calculate_predicted_logits(fp32, target, logits_max, 0, vocab)
        softmax, _loss = VPCE.calculate_cross_entropy_loss(exp, predicted, sum_exp)
    with LogitTraffic(tokens * vocab) as bwd:
        grad_2d, arange_1d, update, grad_input = VPCE.prepare_gradient_calculation_operands(softmax, mask)
        grad = VPCE.calculate_gradients(grad_2d, arange_1d, target_1d, update, grad_input, torch.ones(tokens))
        grad.to(torch.float16)  # the backward of the caller's `.float()` cast
    return fwd.nbytes / logits.numel(), bwd.nbytes / logits.numel()


def test_vocab_parallel_loss_bytes_match_megatrons_own_ops():
    forward, backward = measured_bytes_per_logit()
    assert (forward, backward) == (VOCAB_PARALLEL_CE_BYTES[0], VOCAB_PARALLEL_CE_BYTES[1])


@pytest.mark.parametrize("tp", [1, 8])
def test_head_time_grows_by_the_extra_passes_only(tp):
    spec, gpu = resolve_model("megatron-gpt-1.7b"), resolve_gpu("a100-80gb")
    shard = Shard(mbs=16, seq=2048, tp=tp)
    fused = layer_work(spec, "head", shard)
    op_by_op = layer_work(spec, "head", shard, loss_passes="vocab_parallel_fp32")
    logits = shard.local_tokens * spec.vocab_size / tp
    assert op_by_op.gemms == fused.gemms
    assert op_by_op.elementwise_bytes_fwd - fused.elementwise_bytes_fwd == pytest.approx(
        logits * (VOCAB_PARALLEL_CE_BYTES[0] - FUSED_CE_BYTES[0])
    )
    assert op_by_op.elementwise_bytes_bwd - fused.elementwise_bytes_bwd == pytest.approx(
        logits * (VOCAB_PARALLEL_CE_BYTES[1] - FUSED_CE_BYTES[1])
    )
    compute = AnalyticCompute(gpu, "fp16")
    base = AnalyticSource(spec, compute, CostOptions.of(dtype="fp16")).layer_times("head", shard)
    slow = AnalyticSource(spec, compute, CostOptions.of(dtype="fp16", loss_passes="vocab_parallel_fp32")).layer_times(
        "head", shard
    )
    extra_kernels = 3 * (op_by_op.kernels_fwd - fused.kernels_fwd)  # forward, and twice as many backward
    extra_s = logits * (sum(VOCAB_PARALLEL_CE_BYTES) - sum(FUSED_CE_BYTES)) / compute.mem_bw
    extra_s += extra_kernels * compute.overhead_s
    assert slow.forward_s + slow.backward_s - base.forward_s - base.backward_s == pytest.approx(extra_s, rel=1e-9)


def test_unknown_loss_passes_is_refused():
    with pytest.raises(ValueError, match="loss_passes"):
        CostOptions.of(loss_passes="chunked")
