"""llm-foundry's Triton FlashAttention (`--attention triton_fa1`): its rates against the
published component figures they come from and its head-dimension padding (its memory, the GPUs
without it, the CLI and exporters around it: test_foreign_attention.py)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.shapes import Shard, attention_core_flops, kernel_head_padding, layer_work
from tests.cost.attention_papers import FA1_BACKWARD, FA1_FORWARD, FA3_PAPER_FA2_H100, core_rates
from tests.cost.burst_rates import burst_rates

H100, A100 = burst_rates("h100"), burst_rates("a100-80gb")
MPT_7B, MPT_30B = resolve_model("mpt-7b"), resolve_model("mpt-30b")

FA2_TRITON_FORWARD = (1.3, 1.5)
"""Dao 2023 (FlashAttention-2, arXiv 2307.08691) sec. 4.1, A100: 'FlashAttention-2 is around
1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x faster in the
backward pass'."""
FA2_TRITON_BACKWARD = (1.8, 2.2)
"""'around 2x' read as 2 +- 10%."""
FA1_CUDA_A100 = (FA1_FORWARD, FA1_BACKWARD)
"""The Triton kernel's docstring: 'Triton forward is generally faster than CUDA forward, while
Triton backward is generally slower than CUDA backward' (CUDA = FlashAttention-1)."""


def _tflops(attention: str, gpu, seq: int = 16384) -> tuple[float, float]:
    """Forward and backward TFLOP/s of the attention core over the counted (causal) FLOPs."""
    fwd, bwd, _ = core_rates(attention, gpu, seq)
    return fwd / 1e12, bwd / 1e12


def test_h100_rates_are_fa2s_over_the_a100_triton_ratio():
    """On H100 the pre-MLIR Triton kernel runs Ampere mma.sync code as FA2 does: FA2's measured
    H100 rate over the A100 FA2 / Triton ratio (within the sequence falloff at 16k, 2%)."""
    fwd, bwd = _tflops("triton_fa1", H100)
    fa2_fwd, fa2_bwd = FA3_PAPER_FA2_H100
    assert fa2_fwd / FA2_TRITON_FORWARD[1] * 0.98 <= fwd <= fa2_fwd / FA2_TRITON_FORWARD[0]
    assert fa2_bwd / FA2_TRITON_BACKWARD[1] * 0.98 <= bwd <= fa2_bwd / FA2_TRITON_BACKWARD[0]


def test_a100_rates_sit_between_fa1_cuda_and_fa2():
    """A100: the forward at least FA1-CUDA's lower end and at most FA2's best (73%) / 1.3; the
    backward at most FA1-CUDA's upper end and within the paper's ratio of FA2's own rate."""
    peak = A100.peak_flops("bf16") / 1e12
    fwd, bwd = (rate / peak for rate in _tflops("triton_fa1", A100))
    fa2_fwd, fa2_bwd = (rate / peak for rate in _tflops("flash2", A100))
    (fa1_fwd_low, _), (_, fa1_bwd_high) = FA1_CUDA_A100
    assert fa1_fwd_low <= fwd <= 0.73 / FA2_TRITON_FORWARD[0]
    assert FA2_TRITON_FORWARD[0] <= fa2_fwd / fwd <= FA2_TRITON_FORWARD[1]
    assert bwd <= fa1_bwd_high
    assert FA2_TRITON_BACKWARD[0] <= fa2_bwd / bwd <= FA2_TRITON_BACKWARD[1]


@pytest.mark.parametrize("gpu", [A100, H100], ids=["a100", "h100"])
def test_triton_sits_between_flash2_and_unfused(gpu):
    """The paper: FA2 is 1.3-2.5x faster than the Triton kernel and 3-10x faster than standard
    attention, so the Triton kernel is slower than FA2 and faster than unfused attention
    (MPT-7B's block at its benchmark shape: micro-batch 6, sequence 2048)."""
    shard = Shard(mbs=6, seq=2048)
    compute = AnalyticCompute(gpu)
    total = {
        a: sum(compute.attention_core_times(layer_work(MPT_7B, "transformer", shard, attention=a), a))
        for a in ("flash2", "triton_fa1", "unfused")
    }
    assert total["flash2"] < total["triton_fa1"] < total["unfused"]


def test_head_dimension_padded_to_a_power_of_two():
    """BLOCK_HEADDIM = max(next_power_of_2(d), 16): MPT-30B's 112-wide heads run as 128, MPT-7B's
    128 as they are; tiny heads pad to 16. Other kernels execute the counted FLOPs."""
    assert kernel_head_padding(MPT_30B, "triton_fa1") == pytest.approx(128 / 112)
    assert kernel_head_padding(MPT_7B, "triton_fa1") == 1.0
    tiny = MPT_7B.model_copy(update=dict(hidden_size=256, num_attention_heads=32, num_kv_heads=32))
    assert tiny.kv_channels == 8 and kernel_head_padding(tiny, "triton_fa1") == 2.0
    assert kernel_head_padding(MPT_30B, "flash2") == 1.0
    shard = Shard(mbs=2, seq=2048)
    executed = layer_work(MPT_30B, "transformer", shard, attention="triton_fa1").attention_flops
    assert executed == pytest.approx(attention_core_flops(MPT_30B, shard, flash=True) * 128 / 112)
