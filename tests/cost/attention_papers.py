"""The FlashAttention papers' published kernel figures and benchmark shape, and the model's
attention-core rates measured the way those papers count them: shared by the tests of the
FlashAttention-1-class kernels (test_flash1_attention.py, test_triton_attention.py)."""

from __future__ import annotations

from planner.catalog import resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.shapes import Shard, attention_core_flops, layer_work

BENCH = resolve_model("llama3-8b").model_copy(update=dict(hidden_size=2048, num_attention_heads=16, num_kv_heads=16))
"""The FlashAttention-2 / -3 papers' benchmark shape: 16k tokens per batch, 16 heads of dimension 128."""
FA1_FORWARD = (0.30, 0.50)
"""Dao 2023 (FlashAttention-2, arXiv 2307.08691) sec. 1, A100: FlashAttention's (-1, CUDA)
'forward pass only reaches 30-50% of the theoretical maximum FLOPs/s of the device'."""
FA1_BACKWARD = (0.25, 0.35)
"""The same sentence: 'the backward pass ... reaching only 25-35% of maximum throughput'."""
FA3_PAPER_FA2_H100 = (335.0, 322.0 * 335.0 / 370.0)
"""FlashAttention-2 on H100 SXM5, BF16, head dim 128, 16k tokens (Shah et al. 2024, arXiv
2407.08608): causal forward 335 TFLOP/s (fig. 4); backward 322 non-causal (fig. 6) x the causal /
non-causal forward ratio 335/370."""


def core_rates(attention: str, gpu, seq: int = 16384, spec=BENCH) -> tuple[float, float, float]:
    """Forward, backward and forward + backward FLOP/s of the attention core over the counted
    (causal) FLOPs, 16k tokens per batch (the backward 2.5x the forward's)."""
    shard = Shard(mbs=16384 // seq, seq=seq)
    work = layer_work(spec, "transformer", shard, attention=attention)
    fwd_s, bwd_s = AnalyticCompute(gpu).attention_core_times(work, attention)
    counted = attention_core_flops(spec, shard, flash=True)
    return counted / fwd_s, 2.5 * counted / bwd_s, 3.5 * counted / (fwd_s + bwd_s)
