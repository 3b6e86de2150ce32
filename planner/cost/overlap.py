"""Communication that overlaps compute, and the compute it slows down.

A collective that runs beside compute (the data-parallel reduce-scatter beside the backward,
the parameter all-gather beside the forward, tensor-parallel communication hidden behind
GEMMs, the context-parallel ring beside the attention core) is not free: its kernels hold SMs
(NCCL runs one CTA per channel, TE userbuffers a configured number of SMs), so while it runs
the compute beside it progresses at (1 - f) of its rate, f the share of SMs the collective
holds (`GpuEfficiency.comm_sm_fraction`, cited per GPU in presets/gpus.toml). For `comm`
seconds of communication beside `compute` seconds of compute, both finish after

    max(comm, compute + f * comm)

so the time beyond the compute is max(comm - compute, f * comm): the exposed part of the
communication when it is longer, else the slowdown of the compute it hid behind. A part that
cannot overlap at all (the last gradient bucket) is exposed as a whole. HBM contention is not
charged: the overlapped windows here are GEMMs and attention, compute-bound kernels.
"""

from __future__ import annotations

from planner.spec import GpuEfficiency


def comm_sm_fraction(efficiency: GpuEfficiency, interference: bool) -> float:
    """Share of the GPU's SMs an overlapped collective takes from compute (0 when interference
    is switched off)."""
    return efficiency.comm_sm_fraction if interference else 0.0


def overlapped_extra_time(comm_s: float, compute_s: float, sm_fraction: float, exposed_s: float = 0.0) -> float:
    """Seconds beyond `compute_s` when `comm_s` of communication runs beside it, of which
    `exposed_s` (at most comm_s) cannot overlap: the exposed part, plus the slowdown of the
    compute while the rest runs, or the communication that outlasts the compute."""
    return max(exposed_s + sm_fraction * (comm_s - exposed_s), comm_s - compute_s, 0.0)
