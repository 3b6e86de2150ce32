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
from functools import lru_cache

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


COMBINED_1F1B_ORDER = (
    "combine_bwd",
    "pre_fwd",
    "mlp_bwd",
    "dispatch_fwd",
    "mlp_bwd_dw",
    "dispatch_bwd",
    "mlp_fwd",
    "combine_fwd",
    "pre_bwd",
    "pre_bwd_dw",
)
"""The order in which Megatron-core's TransformerLayerSchedulePlan.run
(megatron/core/models/common/model_chunk_schedule_plan.py, megatron-core 0.19.2) issues one
layer's nodes when a forward (`_fwd`) and a backward (`_bwd`) micro-batch share it (without
`ep_overlap_early_attn_memory_release`; the MTP post-process nodes are empty for a plain
layer). `pre` is the pre-dispatch computation (attention, norm, router, dispatch preprocess)."""

COMBINED_1F1B_INPUTS = {
    "combine_bwd": "b_grad",
    "pre_fwd": "f_input",
    "mlp_bwd": "combine_bwd",
    "dispatch_fwd": "pre_fwd",
    "mlp_bwd_dw": "mlp_bwd",
    "dispatch_bwd": "mlp_bwd",
    "mlp_fwd": "dispatch_fwd",
    "combine_fwd": "mlp_fwd",
    "pre_bwd": "dispatch_bwd",
    "pre_bwd_dw": "pre_bwd",
}
"""What each node waits for besides its stream: the previous node of the same micro-batch
(`b_grad`: the gradient the previous layer's pre_bwd produced; `f_input`: the previous
layer's combine_fwd output)."""


def _node_seconds(layer: SplitLayer, node: str) -> float:
    return {
        "combine_bwd": layer.combine,
        "pre_fwd": layer.pre,
        "mlp_bwd": layer.mlp_dgrad,
        "dispatch_fwd": layer.dispatch,
        "mlp_bwd_dw": layer.mlp_wgrad,
        "dispatch_bwd": layer.dispatch,
        "mlp_fwd": layer.mlp,
        "combine_fwd": layer.combine,
        "pre_bwd": layer.pre_dgrad,
        "pre_bwd_dw": layer.pre_wgrad,
    }[node]


def _stream(node: str) -> str:
    return "comm" if node.startswith(("dispatch", "combine")) else "comp"


def _is_backward(node: str) -> bool:
    return "_bwd" in node


BACKWARD_ALONE_ORDER = tuple(node for node in COMBINED_1F1B_ORDER if _is_backward(node))
"""`TransformerLayerSchedulePlan.run(None, b_layer)`: a backward layer with no forward beside it."""

FORWARD_ALONE_ORDER = tuple(node for node in COMBINED_1F1B_ORDER if not _is_backward(node))
"""`TransformerLayerSchedulePlan.run(f_layer, None)`: a forward layer with no backward beside it."""


class _TwoStreams:
    """The compute and communication streams of one rank and the micro-batches' last nodes:
    each node starts when its stream is free and its input (`COMBINED_1F1B_INPUTS`) is done."""

    __slots__ = ("free", "done")

    def __init__(self) -> None:
        self.free = {"comm": 0.0, "comp": 0.0}
        self.done = {"f_input": 0.0, "b_grad": 0.0}

    def run(self, layer: SplitLayer, nodes: tuple[str, ...]) -> None:
        done, free = self.done, self.free
        for node in nodes:
            stream = _stream(node)
            done[node] = free[stream] = max(free[stream], done[COMBINED_1F1B_INPUTS[node]]) + _node_seconds(layer, node)
            if node == "combine_fwd":
                done["f_input"] = done[node]
            elif node == "pre_bwd":
                done["b_grad"] = done[node]

    @property
    def end(self) -> float:
        return max(self.free.values())


def combined_1f1b_period(layer: SplitLayer, layers: int = 8) -> float:
    """Seconds per layer, in steady state over `layers` identical layers, of Megatron-core's
    combined 1F1B: one micro-batch's forward of each layer beside another's backward of it,
    the all-to-alls (dispatch, combine) on a communication stream, the rest on the compute
    stream, issued in `COMBINED_1F1B_ORDER`:

        comm: combine_bwd | dispatch_fwd -> dispatch_bwd       | combine_fwd
        comp: pre_fwd     | mlp_bwd -> mlp_bwd_dw -> mlp_fwd   | pre_bwd -> pre_bwd_dw

    Each node starts when its stream is free and its input (`COMBINED_1F1B_INPUTS`) is ready.
    No SM contention here (see `combined_1f1b_extra_time`)."""
    streams, ends = _TwoStreams(), []
    for _ in range(layers):
        streams.run(layer, COMBINED_1F1B_ORDER)
        ends.append(streams.end)
    return ends[-1] - ends[-2] if layers > 1 else ends[-1]


def combined_1f1b_step_order(forward_layers: int, backward_layers: int) -> tuple[tuple[str, int], ...]:
    """The nodes, each with its layer's index in its chunk, that `TransformerModelChunkSchedulePlan
    .run` (models/common/model_chunk_schedule_plan.py, megatron-core 0.19.2) issues for a forward
    model chunk of `forward_layers` MoE layers beside a backward chunk of `backward_layers`: it
    pairs min(F, B) layers (forward layer i with backward layer B - 1 - i) in
    `COMBINED_1F1B_ORDER`, then runs the backward chunk's remaining layers alone, then the
    forward chunk's, and defers the last backward layer's pre-dispatch weight gradient to the end
    ("for overlapping with the p2p comm")."""
    order: list[tuple[str, int]] = []
    paired = min(forward_layers, backward_layers)
    for i in range(paired):
        order += [(node, i if not _is_backward(node) else backward_layers - 1 - i) for node in COMBINED_1F1B_ORDER]
    for i in range(paired, backward_layers):
        order += [(node, backward_layers - 1 - i) for node in BACKWARD_ALONE_ORDER]
    for i in range(paired, forward_layers):
        order += [(node, i) for node in FORWARD_ALONE_ORDER]
    if backward_layers:
        order.remove(("pre_bwd_dw", 0))
        order.append(("pre_bwd_dw", 0))
    return tuple(order)


def combined_1f1b_step(layer: SplitLayer, forward_layers: int, backward_layers: int) -> float:
    """Seconds of one combined step of Megatron-core's interleaved schedule (or of the
    no-pipeline one): a forward model chunk of `forward_layers` MoE layers beside a backward
    chunk of `backward_layers`, issued in `combined_1f1b_step_order`. The step starts and ends
    joined: its first nodes wait for the events recorded on the compute stream at its start
    (`record_current_stream`), and its end makes the compute stream wait for both
    micro-batches' events (`wait_current_stream`), so the first layer's combine_bwd has only
    pre_fwd beside it and the last combine_fwd only pre_bwd and its weight gradient, where the
    steady state of `combined_1f1b_period` hides them behind the next layer; layers that find
    no partner run with their all-to-all beside nothing. No SM contention."""
    streams = _TwoStreams()
    for node, _ in combined_1f1b_step_order(forward_layers, backward_layers):
        streams.run(layer, (node,))
    return streams.end


@lru_cache(maxsize=4096)
def combined_1f1b_step_excess(layer: SplitLayer, forward_layers: int, backward_layers: int) -> float:
    """Seconds one combined step takes beyond its layers at the steady state that
    `combined_1f1b_extra_time` charges per layer (forward layers at their forward compute,
    backward layers at theirs, each pair also its steady exposed all-to-all): the joined start
    and end, and the all-to-all of the layers that run alone. Never negative."""
    forward = layer.pre + layer.mlp
    backward = layer.compute_s - forward
    pairs = min(forward_layers, backward_layers)
    exposed = max(combined_1f1b_period(layer) - layer.compute_s, 0.0)
    charged = forward_layers * forward + backward_layers * backward + pairs * exposed
    return max(combined_1f1b_step(layer, forward_layers, backward_layers) - charged, 0.0)


def combined_1f1b_extra_time(layer: SplitLayer, sm_fraction: float) -> float:
    """Seconds per layer pair (one forward, one backward) beyond the compute under combined 1F1B:
    the all-to-all the schedule leaves exposed, plus the slowdown of the compute beside the
    hidden rest (`overlapped_extra_time`)."""
    exposed = min(max(combined_1f1b_period(layer) - layer.compute_s, 0.0), layer.comm_s)
    return overlapped_extra_time(layer.comm_s, layer.compute_s, sm_fraction, exposed)
