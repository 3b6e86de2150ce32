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

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class SplitLayer:
    """One MoE layer's seconds in the pieces Megatron's combined 1F1B schedules apart: the
    pre-dispatch computation (attention, norms, router: `pre`) and the expert MLP (`mlp`), each
    forward, backward-input (`_dgrad`) and backward-weight (`_wgrad`); and its four all-to-alls."""

    pre: float
    mlp: float
    pre_dgrad: float
    pre_wgrad: float
    mlp_dgrad: float
    mlp_wgrad: float
    dispatch: float
    combine: float

    @property
    def compute_s(self) -> float:
        """Compute of one forward and one backward of the layer."""
        return self.pre + self.mlp + self.pre_dgrad + self.pre_wgrad + self.mlp_dgrad + self.mlp_wgrad

    @property
    def comm_s(self) -> float:
        """All-to-all of one forward and one backward (dispatch and combine each way)."""
        return 2 * (self.dispatch + self.combine)


COMBINED_1F1B_ORDER = ("combine_bwd", "pre_fwd", "mlp_bwd", "dispatch_fwd", "mlp_bwd_dw", "dispatch_bwd",
                       "mlp_fwd", "combine_fwd", "pre_bwd", "pre_bwd_dw")
"""The order in which Megatron-core's TransformerLayerSchedulePlan.run
(megatron/core/models/common/model_chunk_schedule_plan.py, megatron-core 0.19.2) issues one
layer's nodes when a forward (`_fwd`) and a backward (`_bwd`) micro-batch share it (without
`ep_overlap_early_attn_memory_release`; the MTP post-process nodes are empty for a plain
layer). `pre` is the pre-dispatch computation (attention, norm, router, dispatch preprocess)."""

COMBINED_1F1B_INPUTS = {
    "combine_bwd": "b_grad", "pre_fwd": "f_input", "mlp_bwd": "combine_bwd", "dispatch_fwd": "pre_fwd",
    "mlp_bwd_dw": "mlp_bwd", "dispatch_bwd": "mlp_bwd", "mlp_fwd": "dispatch_fwd", "combine_fwd": "mlp_fwd",
    "pre_bwd": "dispatch_bwd", "pre_bwd_dw": "pre_bwd",
}
"""What each node waits for besides its stream: the previous node of the same micro-batch
(`b_grad`: the gradient the previous layer's pre_bwd produced; `f_input`: the previous
layer's combine_fwd output)."""


def _node_seconds(layer: SplitLayer, node: str) -> float:
    return {"combine_bwd": layer.combine, "pre_fwd": layer.pre, "mlp_bwd": layer.mlp_dgrad,
            "dispatch_fwd": layer.dispatch, "mlp_bwd_dw": layer.mlp_wgrad, "dispatch_bwd": layer.dispatch,
            "mlp_fwd": layer.mlp, "combine_fwd": layer.combine, "pre_bwd": layer.pre_dgrad,
            "pre_bwd_dw": layer.pre_wgrad}[node]


def combined_1f1b_period(layer: SplitLayer, layers: int = 8) -> float:
    """Seconds per layer, in steady state over `layers` identical layers, of Megatron-core's
    combined 1F1B: one micro-batch's forward of each layer beside another's backward of it,
    the all-to-alls (dispatch, combine) on a communication stream, the rest on the compute
    stream, issued in `COMBINED_1F1B_ORDER`:

        comm: combine_bwd | dispatch_fwd -> dispatch_bwd       | combine_fwd
        comp: pre_fwd     | mlp_bwd -> mlp_bwd_dw -> mlp_fwd   | pre_bwd -> pre_bwd_dw

    Each node starts when its stream is free and its input (`COMBINED_1F1B_INPUTS`) is ready.
    No SM contention here (see `combined_1f1b_extra_time`)."""
    free = {"comm": 0.0, "comp": 0.0}
    done = {"f_input": 0.0, "b_grad": 0.0}
    ends = []
    for _ in range(layers):
        for node in COMBINED_1F1B_ORDER:
            stream = "comm" if node.startswith(("dispatch", "combine")) else "comp"
            done[node] = free[stream] = max(free[stream], done[COMBINED_1F1B_INPUTS[node]]) + _node_seconds(layer, node)
        done["f_input"], done["b_grad"] = done["combine_fwd"], done["pre_bwd"]
        ends.append(max(free.values()))
    return ends[-1] - ends[-2] if layers > 1 else ends[-1]


def combined_1f1b_extra_time(layer: SplitLayer, sm_fraction: float) -> float:
    """Seconds per layer pair (one forward, one backward) beyond the compute under combined 1F1B:
    the all-to-all the schedule leaves exposed, plus the slowdown of the compute beside the
    hidden rest (`overlapped_extra_time`)."""
    exposed = min(max(combined_1f1b_period(layer) - layer.compute_s, 0.0), layer.comm_s)
    return overlapped_extra_time(layer.comm_s, layer.compute_s, sm_fraction, exposed)
