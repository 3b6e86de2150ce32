"""Compute time of a layer from its work: the analytic roofline with shape-dependent
efficiency that stands in for measurements when no profile is given.

A GEMM of shape (m, n, k) takes

    max( 2mnk / (peak * e_gemm * s(m) s(n) s(k)),  2 (mk + kn + mn) / (bw * e_hbm) ) + c

where s(x) = x / (x + x_half) models the falloff of small dimensions (tile and wave
quantisation; `gemm_half_dim` is x_half), e_gemm the achieved fraction of peak on large
GEMMs, bw the HBM bandwidth and c the per-kernel overhead. The attention core runs at
e_attn_fwd (forward) and e_attn_bwd (backward, 2.5x the forward FLOPs with flash attention,
which recomputes QK^T: Dao 2023), with the same falloff in sequence length. Memory-bound
kernels move their bytes at bw * e_hbm. The backward of a GEMM is a data-gradient GEMM
(m, k, n), charged to backward-input (I), and a weight-gradient GEMM (k, n, m), charged to
backward-weight (W), as the zero-bubble schedules split them (Qi et al. 2024).

The efficiencies are per-GPU data (presets/gpus.toml); `planner profile` measurements fit them.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.shapes import LayerWork
from planner.spec import GpuEfficiency, GpuSpec

FLASH_BACKWARD_FLOP_RATIO = 2.5
"""Flash attention's backward executes 5 matmuls per 2 of the forward (it recomputes QK^T)."""
UNFUSED_BACKWARD_FLOP_RATIO = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTimes:
    """Compute time of one layer for one micro-batch, seconds."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float

    @property
    def backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s

    def scaled(self, factor: float) -> LayerTimes:
        return LayerTimes(
            forward_s=self.forward_s * factor,
            backward_input_s=self.backward_input_s * factor,
            backward_weight_s=self.backward_weight_s * factor,
        )


class AnalyticCompute:
    """Layer times on one GPU from FLOPs, bytes and the GPU's efficiency curves."""

    def __init__(self, gpu: GpuSpec, dtype: str = "bf16", efficiency: GpuEfficiency | None = None):
        self.gpu = gpu
        self.eff = efficiency or gpu.efficiency
        self.peak = gpu.peak_flops(dtype)
        self.mem_bw = gpu.hbm_bw_gbps * 1e9 * self.eff.hbm
        self.overhead_s = self.eff.kernel_overhead_us * 1e-6

    def _saturation(self, x: float) -> float:
        return x / (x + self.eff.gemm_half_dim)

    def gemm_time(self, m: int, n: int, k: int) -> float:
        """Seconds for one (m x k) @ (k x n) GEMM."""
        sat = self._saturation(m) * self._saturation(n) * self._saturation(k)
        compute = 2.0 * m * n * k / (self.peak * self.eff.gemm * sat)
        memory = 2.0 * (m * k + k * n + m * n) / self.mem_bw
        return max(compute, memory) + self.overhead_s

    def attention_time(self, flops: float, seq: int, backward: bool, flash: bool = True) -> float:
        """Seconds for the attention core's forward, or its backward, given forward FLOPs."""
        if flops == 0.0:
            return 0.0
        if backward:
            ratio = FLASH_BACKWARD_FLOP_RATIO if flash else UNFUSED_BACKWARD_FLOP_RATIO
            return ratio * flops / (self.peak * self.eff.attention_bwd * self._saturation(seq))
        return flops / (self.peak * self.eff.attention_fwd * self._saturation(seq))

    def elementwise_time(self, nbytes: float, kernels: int) -> float:
        """Seconds for memory-bound kernels moving nbytes in `kernels` launches."""
        return nbytes / self.mem_bw + kernels * self.overhead_s

    def layer_times(self, work: LayerWork, flash: bool = True) -> LayerTimes:
        """Forward, backward-input and backward-weight time of a layer's work."""
        forward = backward_input = backward_weight = 0.0
        for g in work.gemms:
            forward += g.count * self.gemm_time(g.m, g.n, g.k)
            backward_input += g.count * self.gemm_time(g.m, g.k, g.n)
            backward_weight += g.count * self.gemm_time(g.k, g.n, g.m)
        forward += self.attention_time(work.attention_flops, work.attention_seq, False, flash)
        backward_input += self.attention_time(work.attention_flops, work.attention_seq, True, flash)
        forward += self.elementwise_time(work.elementwise_bytes_fwd, work.kernels_fwd)
        backward_input += self.elementwise_time(work.elementwise_bytes_bwd, 2 * work.kernels_fwd)
        return LayerTimes(
            forward_s=forward, backward_input_s=backward_input, backward_weight_s=backward_weight
        )
