"""One GEMM by the roofline written out by hand from a GPU preset's fields, the independent
reference tests set beside AnalyticCompute (planner/cost/compute.py)."""

from __future__ import annotations

from planner.cost.compute import AnalyticCompute


def closed_form_gemm_s(compute: AnalyticCompute, m: int, n: int, k: int, output_bytes: float = 2.0) -> float:
    """Seconds of one (m x k) @ (k x n) bf16 GEMM: peak x e_gemm x s(m) s(n) s(k) against both
    16-bit operands read and the output moving `output_bytes` per element, plus one kernel's
    overhead. Only for a GPU without a measured GEMM table or rate factors, at its own pace."""
    eff = compute.eff
    assert eff.gemm_table is None and eff.sustained_compute == 1.0 and compute.compute_slowdown == 1.0
    falloff = 1.0
    for dim in (m, n, k):
        falloff *= dim / (dim + eff.gemm_half_dim)
    flops_s = 2.0 * m * n * k / (compute.gpu.peak_flops("bf16") * eff.gemm * falloff)
    bytes_s = (2.0 * (m * k + k * n) + output_bytes * m * n) / (compute.gpu.hbm_bw_gbps * 1e9 * eff.hbm)
    return max(flops_s, bytes_s) + eff.kernel_overhead_us * 1e-6
