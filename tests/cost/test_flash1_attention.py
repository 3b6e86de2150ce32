"""FlashAttention-1's CUDA kernel (`--attention flash1`): its A100 rates against the ranges the
FlashAttention-2 paper states for it, its place beside the Triton FlashAttention-1 and
FlashAttention-2, its Hopper rates and its head dimensions (its memory, the GPUs without it, the
CLI and exporters around it: test_foreign_attention.py)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.shapes import Shard, kernel_head_padding, layer_work
from tests.cost.attention_papers import FA1_BACKWARD, FA1_FORWARD, FA3_PAPER_FA2_H100, core_rates
from tests.cost.burst_rates import burst_rates

A100, H100 = burst_rates("a100-80gb"), burst_rates("h100")
MPT_7B, MPT_30B = resolve_model("mpt-7b"), resolve_model("mpt-30b")

FA1_OVERALL = (0.25, 0.40)
"""The FlashAttention-2 paper's abstract (Dao 2023): FlashAttention 'reaching only 25-40% of the
theoretical maximum FLOPs/s'."""


def _fractions(attention: str, gpu, seq: int = 2048) -> tuple[float, float, float]:
    """Forward, backward and forward + backward fractions of peak of the attention core."""
    peak = gpu.peak_flops("bf16")
    return tuple(rate / peak for rate in core_rates(attention, gpu, seq))


@pytest.mark.parametrize("seq", [2048, 16384])
def test_a100_rates_sit_in_the_papers_ranges(seq):
    """Forward within 30-50 %, backward within 25-35 %, and the two together within the
    abstract's 25-40 % (under the sequence falloff, at 2k and at 16k tokens)."""
    fwd, bwd, overall = _fractions("flash1", A100, seq)
    assert FA1_FORWARD[0] <= fwd <= FA1_FORWARD[1]
    assert FA1_BACKWARD[0] <= bwd <= FA1_BACKWARD[1]
    assert FA1_OVERALL[0] <= overall <= FA1_OVERALL[1]


def test_a100_rates_are_the_middles_of_the_ranges():
    eff = resolve_gpu("a100-80gb").efficiency
    assert eff.flash1_fwd == pytest.approx(sum(FA1_FORWARD) / 2)
    assert eff.flash1_bwd == pytest.approx(sum(FA1_BACKWARD) / 2)
    assert resolve_gpu("a100-40gb").efficiency.flash1_fwd == eff.flash1_fwd


def test_triton_kernel_is_faster_forward_and_slower_backward():
    """llm-foundry's Triton FlashAttention's docstring: 'Triton forward is generally faster than
    CUDA forward, while Triton backward is generally slower than CUDA backward'."""
    cuda_fwd, cuda_bwd, _ = _fractions("flash1", A100)
    triton_fwd, triton_bwd, _ = _fractions("triton_fa1", A100)
    assert triton_fwd > cuda_fwd and triton_bwd < cuda_bwd


@pytest.mark.parametrize("gpu", [A100, H100], ids=["a100", "h100"])
def test_flash2_is_faster_and_unfused_slower(gpu):
    """FlashAttention-2 is faster than FlashAttention-1 in both directions (the paper's point),
    and FlashAttention-1 is faster than standard attention (MPT-7B's block, micro-batch 6,
    sequence 2048)."""
    shard = Shard(mbs=6, seq=2048)
    compute = AnalyticCompute(gpu)
    times = {
        a: compute.attention_core_times(layer_work(MPT_7B, "transformer", shard, attention=a), a)
        for a in ("flash2", "flash1", "unfused")
    }
    assert all(f2 < f1 for f2, f1 in zip(times["flash2"], times["flash1"]))
    assert sum(times["flash1"]) < sum(times["unfused"])


def test_h100_rates_are_fa2s_times_the_a100_ratio():
    """On Hopper the kernel issues the same Ampere instructions as FlashAttention-2 does there:
    FA2's measured H100 rate times FlashAttention-1's A100 range over FA2's A100 rate (within the
    sequence falloff at 16k, 2 %)."""
    peak = H100.peak_flops("bf16") / 1e12
    fwd, bwd, _ = _fractions("flash1", H100, 16384)
    a100 = resolve_gpu("a100-80gb").efficiency
    fa2_fwd, fa2_bwd = (rate / peak for rate in FA3_PAPER_FA2_H100)
    low_fwd, high_fwd = (fa2_fwd * end / a100.attention_fwd for end in FA1_FORWARD)
    low_bwd, high_bwd = (fa2_bwd * end / a100.attention_bwd for end in FA1_BACKWARD)
    assert low_fwd * 0.98 <= fwd <= high_fwd
    assert low_bwd * 0.98 <= bwd <= high_bwd


def test_heads_are_not_padded():
    """The kernel runs head dimensions up to 128 as they are (MPT-30B's 112)."""
    assert kernel_head_padding(MPT_30B, "flash1") == 1.0
