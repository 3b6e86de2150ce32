"""Compute time of a layer from its work: the analytic roofline with shape-dependent
efficiency that stands in for measurements when no profile is given.

A GEMM of shape (m, n, k) takes

    max( 2mnk / (peak * e_gemm * s(m) s(n) s(k)),  2 (mk + kn + mn) / (bw * e_hbm) ) + c

where s(x) = x / (x + x_half) models the falloff of small dimensions (tile and wave
quantisation; `gemm_half_dim` is x_half), e_gemm the achieved fraction of peak on large
GEMMs, bw the HBM bandwidth and c the per-kernel overhead. The attention core runs at
e_attn_fwd (forward) and e_attn_bwd (backward, 2.5x the forward FLOPs with flash attention,
which recomputes QK^T: Dao 2023), with the same falloff in sequence length, or, for a kernel
the GPU's `attention_table` measured, that kernel's own measured falloff (its rate at the
sequence over its rate at the table's reference length; planner/cost/attention_table.py). Memory-bound
kernels move their bytes at bw * e_hbm.

The attention core is one of six implementations (`AttentionImpl`): the fused kernels
FlashAttention-2 (e_attn_* = `attention_fwd/bwd`), FlashAttention-1's CUDA kernel,
FlashAttention-3, cuDNN's fused attention and the FlashAttention-1-class Triton kernel
llm-foundry runs as attn_impl 'triton' (their own rates per GPU, `flash1_*`, `flash3_*`,
`cudnn_*` and `triton_fa1_*`), or unfused attention: QK^T and PV as
batched GEMMs over the full s x s score matrix, and the softmax (with its scale and mask) and
dropout as memory-bound passes over the b * a * s^2 scores (`shapes.attention_passes`). The backward of a GEMM is a data-gradient GEMM
(m, k, n), charged to backward-input (I), and a weight-gradient GEMM (k, n, m), charged to
backward-weight (W), as the zero-bubble schedules split them (Qi et al. 2024). A W GEMM that
accumulates into an fp32 main gradient reads and writes it (8 bytes per weight in the memory
term, not 2; planner/cost/grad_accum.py).

Where a GPU has a measured GEMM table (`gemm_table` in presets/gpus.toml, read by
planner/cost/gemm_table.py; `fp8_gemm_table` for fp8 GEMMs), its bf16/fp16 (fp8) GEMMs take
peak * e_gemm * s(m) s(n) s(k) from the table instead (interpolated by shape, times `gemm_table_scale`); the roofline's memory term
and c stay. Those rates were timed in bursts; a training run holds the GPU at its power limit,
so the compute-bound rates (GEMM table or prior, attention) take the GPU's `sustained_compute`,
its sustained over its burst matmul throughput (1 where the rates are sustained ones or no such
measurement exists; docs/h100_rates.md section e). The efficiencies are per-GPU data
(presets/gpus.toml); `planner profile` measurements fit them.

A job waits for its slowest GPU: `compute_slowdown` (planner/cost/stragglers.py) lowers every
compute-bound rate (GEMMs, attention) by the expected slowest-of-N factor; HBM-bound terms and c
keep theirs (the measured spread is in the SM clock under the power limit, the memory clock fixed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from planner.cost.attention_table import FLASH_BACKWARD_FLOP_RATIO, AttentionTable, load_attention_table
from planner.cost.gemm_table import GemmTable, load_gemm_table
from planner.cost.shapes import Gemm, LayerWork
from planner.errors import PlannerError
from planner.spec import GpuEfficiency, GpuSpec

AttentionImpl = Literal["flash1", "flash2", "flash3", "cudnn", "triton_fa1", "unfused"]
ATTENTION_IMPLS: tuple[str, ...] = get_args(AttentionImpl)

TABLE_DTYPES = ("bf16", "fp16")
"""Dtypes a bf16 GEMM table applies to (the same tensor-core peak on every GPU here)."""


def fused_kernel_rates(eff: GpuEfficiency) -> dict[str, tuple[float | None, float | None]]:
    """Forward and backward fractions of peak of each fused attention kernel on a GPU with
    efficiencies `eff` (None where the kernel has no rate there)."""
    return {
        "flash1": (eff.flash1_fwd, eff.flash1_bwd),
        "flash2": (eff.attention_fwd, eff.attention_bwd),
        "flash3": (eff.flash3_fwd, eff.flash3_bwd),
        "cudnn": (eff.cudnn_fwd, eff.cudnn_bwd),
        "triton_fa1": (eff.triton_fa1_fwd, eff.triton_fa1_bwd),
    }


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

    def __init__(
        self,
        gpu: GpuSpec,
        dtype: str = "bf16",
        efficiency: GpuEfficiency | None = None,
        gemm_dtype: str | None = None,
        compute_slowdown: float = 1.0,
        wgrad_output_bytes: float = 2.0,
    ):
        self.gpu = gpu
        self.wgrad_output_bytes = wgrad_output_bytes
        """HBM bytes per weight a weight-gradient GEMM moves for its output (2: a new 16-bit
        gradient; 8: an fp32 main gradient accumulated in place, planner/cost/grad_accum.py)."""
        self.compute_slowdown = compute_slowdown
        """Factor on the compute-bound time of GEMMs and attention: the job's slowest GPU
        (planner/cost/stragglers.py); memory-bound time and per-kernel overhead keep theirs."""
        self.eff = efficiency or gpu.efficiency
        self.peak = gpu.peak_flops(dtype)
        self.gemm_peak = gpu.peak_flops(gemm_dtype) if gemm_dtype else self.peak
        """Peak of the linear layers' GEMMs: the fp8 rate under FP8 training (Transformer
        Engine runs the linears in fp8; attention, norms, softmax and the optimizer stay bf16/fp32)."""
        self.mem_bw = gpu.hbm_bw_gbps * 1e9 * self.eff.hbm
        self.overhead_s = self.eff.kernel_overhead_us * 1e-6
        self._gemm_table = self._table(gemm_dtype or dtype)
        self._batched_table = self._table(dtype)
        self._attention_table: AttentionTable | None = (
            load_attention_table(self.eff.attention_table) if self.eff.attention_table else None
        )

    @property
    def _measured_pace(self) -> float:
        """Factor on the compute-bound time of GEMMs and attention: the job's slowest GPU, over
        the GPU's sustained share of its burst-timed rates."""
        return self.compute_slowdown / self.eff.sustained_compute

    def _table(self, dtype: str) -> GemmTable | None:
        """The GPU's measured GEMM table where it applies to `dtype` (its bf16 table for bf16
        and fp16, its fp8 table for fp8), else None."""
        name, dtypes = (
            (self.eff.gemm_table, TABLE_DTYPES) if dtype in TABLE_DTYPES else (self.eff.fp8_gemm_table, ("fp8",))
        )
        if name is None or dtype not in dtypes:
            return None
        table = load_gemm_table(name)
        return table if table.dtype in dtypes else None

    def _saturation(self, x: float) -> float:
        return x / (x + self.eff.gemm_half_dim)

    def _gemm_rate(self, m: int, n: int, k: int, peak: float, table: GemmTable | None, batch: int = 1) -> float:
        """Achieved FLOP/s of `batch` (m x k) @ (k x n) GEMMs in one kernel: measured by shape
        where a table applies (a batch as one GEMM of batch*m rows, the table's own reading of
        its batched entries), else the peak times e_gemm and the saturation falloff."""
        if table is not None:
            return table.rate(batch * m, n, k) * self.eff.gemm_table_scale / self._measured_pace
        return (
            peak * self.eff.gemm * self._saturation(m) * self._saturation(n) * self._saturation(k) / self._measured_pace
        )

    def gemm_time(self, m: int, n: int, k: int, output_bytes: float = 2.0) -> float:
        """Seconds for one (m x k) @ (k x n) GEMM whose output moves `output_bytes` per element."""
        compute = 2.0 * m * n * k / self._gemm_rate(m, n, k, self.gemm_peak, self._gemm_table)
        memory = (2.0 * (m * k + k * n) + output_bytes * m * n) / self.mem_bw
        return max(compute, memory) + self.overhead_s

    def batched_gemm_time(self, g: Gemm) -> float:
        """Seconds for `g.count` independent GEMMs of one shape in one batched kernel."""
        compute = g.flops / self._gemm_rate(g.m, g.n, g.k, self.peak, self._batched_table, g.count)
        memory = 2.0 * g.count * (g.m * g.k + g.k * g.n + g.m * g.n) / self.mem_bw
        return max(compute, memory) + self.overhead_s

    def attention_rates(self, attention: str) -> tuple[float, float]:
        """Forward and backward fractions of peak of a fused attention kernel on this GPU."""
        kernels = fused_kernel_rates(self.eff)
        rates = kernels.get(attention)
        if rates is None:
            raise PlannerError(f"unknown attention implementation '{attention}': choose {', '.join(ATTENTION_IMPLS)}")
        if rates[0] is None or rates[1] is None:
            offered = [a for a in ATTENTION_IMPLS if a == "unfused" or kernels[a][0] is not None]
            raise PlannerError(
                f"{self.gpu.name} has no measured {attention} attention kernel: choose {', '.join(offered)}"
            )
        return rates[0], rates[1]

    def attention_time(self, flops: float, seq: int, backward: bool, attention: str = "flash2") -> float:
        """Seconds for a fused attention core's forward, or its backward, given forward FLOPs
        (flash-style backward: 2.5x the forward FLOPs, QK^T recomputed)."""
        if flops == 0.0:
            return 0.0
        fwd_rate, bwd_rate = self.attention_rates(attention)
        if backward:
            flops *= FLASH_BACKWARD_FLOP_RATIO
        rate = bwd_rate if backward else fwd_rate
        falloff = self._attention_table.falloff(attention, seq, backward) if self._attention_table else None
        if falloff is None:
            falloff = self._saturation(seq)
        return flops * self._measured_pace / (self.peak * rate * falloff)

    def attention_core_times(self, work: LayerWork, attention: str = "flash2") -> tuple[float, float]:
        """Forward and backward seconds of a layer's attention core under `attention`."""
        if attention != "unfused":
            return (
                self.attention_time(work.attention_flops, work.attention_seq, False, attention),
                self.attention_time(work.attention_flops, work.attention_seq, True, attention),
            )
        forward = backward = 0.0
        for g in work.attention_gemms:  # backward: the data-gradient GEMMs of both operands
            forward += self.batched_gemm_time(g)
            backward += self.batched_gemm_time(g._replace(n=g.k, k=g.n))
            backward += self.batched_gemm_time(g._replace(m=g.k, k=g.m))
        forward += self.elementwise_time(work.attention_bytes_fwd, work.attention_kernels)
        backward += self.elementwise_time(work.attention_bytes_bwd, work.attention_kernels)
        return forward, backward

    def elementwise_time(self, nbytes: float, kernels: int) -> float:
        """Seconds for memory-bound kernels moving nbytes in `kernels` launches."""
        return nbytes / self.mem_bw + kernels * self.overhead_s

    def gemms_times(self, gemms: Iterable[Gemm]) -> LayerTimes:
        """Forward, backward-input (data-gradient GEMMs) and backward-weight (weight-gradient
        GEMMs, their output at `wgrad_output_bytes`) seconds of `gemms`."""
        forward = backward_input = backward_weight = 0.0
        for g in gemms:
            forward += g.count * self.gemm_time(g.m, g.n, g.k)
            backward_input += g.count * self.gemm_time(g.m, g.k, g.n)
            backward_weight += g.count * self.gemm_time(g.k, g.n, g.m, self.wgrad_output_bytes)
        return LayerTimes(forward_s=forward, backward_input_s=backward_input, backward_weight_s=backward_weight)

    def layer_times(self, work: LayerWork, attention: str = "flash2") -> LayerTimes:
        """Forward, backward-input and backward-weight time of a layer's work, its attention
        core run by `attention`."""
        gemms = self.gemms_times(work.gemms)
        forward, backward_input, backward_weight = gemms.forward_s, gemms.backward_input_s, gemms.backward_weight_s
        attention_fwd, attention_bwd = self.attention_core_times(work, attention)
        forward += attention_fwd
        backward_input += attention_bwd
        forward += self.elementwise_time(work.elementwise_bytes_fwd, work.kernels_fwd)
        backward_input += self.elementwise_time(work.elementwise_bytes_bwd, work.backward_kernels)
        return LayerTimes(forward_s=forward, backward_input_s=backward_input, backward_weight_s=backward_weight)
