"""Predict one layout: per-chunk costs from the cost model, the pipeline schedule's timing,
data-parallel communication and the optimizer step, memory per pipeline rank.

    step = max_r(finish_r + exposed_dp_r) + max_r(optimizer_r)

finish_r is when pipeline rank r ends its last compute action in the schedule simulation;
exposed_dp_r is the part of its gradient reduction (and, with a distributed optimizer, the
parameter all-gather) that does not overlap the backward (forward) of one micro-batch,
never less than one bucket: one collective call per Megatron-LM DDP bucket (FSDP: per layer),
each paying its own latency; the optimizer step is memory-bound over the rank's shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import memory
from planner.cost.comm import grad_bucket_count
from planner.cost.model import CostModel
from planner.cost.shapes import Shard, model_flops_per_token
from planner.layout import Layout
from planner.pipeline import ChunkCosts, PipelineTiming, pipeline_timing
from planner.plan import MemoryBreakdown, Predicted
from planner.schedule import head_rank
from planner.units import GiB

OPTIMIZER_BYTES_PER_PARAM = 30.0
"""Adam step traffic per locally owned parameter: read fp32 master, grad, m, v (16 B),
write master, m, v (12 B) and the bf16 copy (2 B)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMemory:
    """Bytes on one pipeline rank."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.other


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Everything predicted for one layout (hot-path form of `plan.Predicted`)."""

    step_time_s: float
    tokens_per_s: float
    mfu: float
    bubble_fraction: float
    memory: tuple[RankMemory, ...]
    time_breakdown_s: dict[str, float]
    timing: PipelineTiming

    @property
    def peak_memory_bytes(self) -> float:
        return max(m.total for m in self.memory)

    def to_predicted(self) -> Predicted:
        """The JSON-contract form (memory in GiB)."""
        worst = max(self.memory, key=lambda m: m.total)
        return Predicted(
            step_time_s=self.step_time_s,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu,
            bubble_fraction=self.bubble_fraction,
            memory_gb_per_stage=[round(m.total / GiB, 3) for m in self.memory],
            memory_breakdown_gb=MemoryBreakdown(
                weights=round(worst.weights / GiB, 3),
                grads=round(worst.grads / GiB, 3),
                optimizer=round(worst.optimizer / GiB, 3),
                activations=round(worst.activations / GiB, 3),
                other=round(worst.other / GiB, 3),
            ),
            time_breakdown_s={k: round(v, 6) for k, v in self.time_breakdown_s.items()},
        )


def chunk_costs(model: CostModel, layout: Layout, seq: int) -> ChunkCosts:
    """Per (rank, chunk) forward / backward-input / backward-weight seconds, saved
    activation bytes per micro-batch, transient bytes, parameters, and the p2p time."""
    spec = model.spec
    shard = Shard(mbs=layout.mbs, seq=seq, tp=layout.tp, cp=layout.cp,
                  sequence_parallel=layout.sequence_parallel)
    pp, vpp = layout.pp, layout.vpp
    blocks = {mode: model.layer_costs("transformer", shard, mode) for mode in set(layout.recompute)}
    embedding, head = model.layer_costs("embedding", shard), model.layer_costs("head", shard)
    fwd, bwd_in, bwd_w, act = [], [], [], []
    extra, params, tp_comm = [0.0] * pp, [0.0] * pp, [0.0] * pp
    for rank, per_rank in enumerate(layout.stage_layers):
        block = blocks[layout.recompute[rank]]
        block_fwd = block.forward_s + block.comm_forward_s
        block_bwd_in = block.backward_input_s + block.comm_backward_s
        layers = [end - start for start, end in per_rank]
        fwd.append([n * block_fwd for n in layers])
        bwd_in.append([n * block_bwd_in for n in layers])
        bwd_w.append([n * block.backward_weight_s for n in layers])
        act.append([n * block.activation_bytes for n in layers])
        total = sum(layers)
        params[rank] = total * block.param_count
        tp_comm[rank] = total * (block.comm_forward_s + block.comm_backward_s)
        extra[rank] = block.peak_extra_bytes if total else 0.0
    last_rank = head_rank(layout.schedule, pp, vpp)
    for costs, rank, chunk in ((embedding, 0, 0), (head, last_rank, vpp - 1)):
        fwd[rank][chunk] += costs.forward_s + costs.comm_forward_s
        bwd_in[rank][chunk] += costs.backward_input_s + costs.comm_backward_s
        bwd_w[rank][chunk] += costs.backward_weight_s
        act[rank][chunk] += costs.activation_bytes
        params[rank] += costs.param_count
        tp_comm[rank] += costs.comm_forward_s + costs.comm_backward_s
        extra[rank] = max(extra[rank], costs.peak_extra_bytes)
    if spec.tie_embeddings and last_rank == 0:
        params[0] -= spec.vocab_size * spec.hidden_size / layout.tp
    p2p_bytes = model.dtype_bytes * shard.local_tokens * spec.hidden_size / layout.tp
    p2p_s = model.network.p2p(p2p_bytes, pp, layout.tp * layout.cp * layout.dp) if pp > 1 else 0.0
    return ChunkCosts(
        forward_s=fwd, backward_input_s=bwd_in, backward_weight_s=bwd_w,
        activation_bytes=act, extra_bytes=extra, params=params, tp_comm_s=tp_comm, p2p_s=p2p_s,
    )


def predict(model: CostModel, layout: Layout, global_batch: int, seq: int) -> Prediction:
    """Step time, throughput, MFU, bubble and memory of `layout` for this job."""
    costs = chunk_costs(model, layout, seq)
    timing = pipeline_timing(costs, layout.schedule, layout.pp, layout.vpp, layout.num_microbatches)
    dp_exposed = [exposed_dp_time(model, layout, costs, r) for r in range(layout.pp)]
    optimizer = [optimizer_time(model, layout.zero_stage, _dp_shards(layout), costs.params[r])
                 for r in range(layout.pp)]
    finish = [timing.finish_s[r] + dp_exposed[r] for r in range(layout.pp)]
    critical = max(range(layout.pp), key=lambda r: finish[r])
    step = finish[critical] + max(optimizer)
    tokens = global_batch * seq
    model_flops = model_flops_per_token(model.spec, seq) * tokens
    peak = model.cluster.gpu.peak_flops(model.options.dtype)
    mfu = model_flops / (step * layout.num_gpus * peak)
    busy = timing.busy_s[critical]
    m = layout.num_microbatches
    breakdown = {
        "compute": busy - m * costs.tp_comm_s[critical],
        "tp_cp_comm": m * costs.tp_comm_s[critical],
        "pipeline_bubble": timing.finish_s[critical] - busy,
        "dp_comm_exposed": dp_exposed[critical],
        "optimizer": max(optimizer),
    }
    return Prediction(
        step_time_s=step,
        tokens_per_s=tokens / step,
        mfu=mfu,
        bubble_fraction=timing.bubble_fraction,
        memory=layout_memory(model, layout, costs, timing.peak_activation_bytes),
        time_breakdown_s=breakdown,
        timing=timing,
    )


def _dp_shards(layout: Layout) -> int:
    return layout.dp * layout.cp


def exposed_dp_time(model: CostModel, layout: Layout, costs: ChunkCosts, rank: int) -> float:
    """Gradient reduce-scatter (all-reduce without a sharded optimizer) and parameter
    all-gather of the rank's weights over the DP x CP group, minus what overlaps."""
    shards = _dp_shards(layout)
    if shards == 1:
        return 0.0
    net, opts = model.network, model.options
    stride = layout.tp
    params = costs.params[rank]
    grad_bytes = params * opts.grad_reduce_bytes
    param_bytes = params * model.dtype_bytes
    calls = _dp_calls(model, layout, rank, params)
    bucket = 1.0 / calls
    if layout.zero_stage == 0:
        reduce = calls * net.all_reduce(grad_bytes / calls, shards, stride)
        gather = 0.0
    else:
        reduce = calls * net.reduce_scatter(grad_bytes / calls, shards, stride)
        gather = calls * net.all_gather(param_bytes / calls, shards, stride)
    if layout.zero_stage == 3:  # FSDP frees the gathered weights after the forward and
        reduce += gather        # gathers them again for the backward (Rajbhandari et al. 2020: 3x)
    backward = sum(costs.backward_input_s[rank]) + sum(costs.backward_weight_s[rank])
    forward = sum(costs.forward_s[rank])
    exposed = reduce if not opts.overlap_grad_reduce else max(reduce * bucket, reduce - backward)
    if gather:
        exposed += gather if not opts.overlap_param_gather else max(gather * bucket, gather - forward)
    return exposed


def _dp_calls(model: CostModel, layout: Layout, rank: int, params: float) -> int:
    """Collective calls of one DP reduction: FSDP reduces each layer on its own; Megatron-LM's
    DDP one per bucket (on the first pipeline rank; one bucket on the others)."""
    if layout.zero_stage == 3:
        return max(1, _layers_on(layout, rank))
    return max(1, grad_bucket_count(params, layout.dp, rank, model.options.overlap_grad_reduce))


def optimizer_time(model: CostModel, zero_stage: int, dp_shards: int, params: float) -> float:
    """Memory-bound Adam step over the parameters this GPU owns, plus the grad-norm read."""
    owned = params / dp_shards if zero_stage >= 1 else params
    nbytes = owned * OPTIMIZER_BYTES_PER_PARAM + params * model.options.grad_reduce_bytes
    return model.analytic.elementwise_time(nbytes, kernels=8)


def layout_memory(model: CostModel, layout: Layout, costs: ChunkCosts,
                  peak_activation_bytes: tuple[float, ...]) -> tuple[RankMemory, ...]:
    """Memory of every pipeline rank, given the peak bytes of activations each holds."""
    return tuple(_rank_memory(model, layout, costs, peak_activation_bytes[r], r) for r in range(layout.pp))


def _rank_memory(model: CostModel, layout: Layout, costs: ChunkCosts, peak_activations: float,
                 rank: int) -> RankMemory:
    state = memory.state_bytes_per_param(layout.zero_stage, _dp_shards(layout))
    params = costs.params[rank]
    activations = peak_activations + costs.extra_bytes[rank]
    weights = params * state.weights
    if layout.zero_stage == 3:  # unsharded bf16 copy of the chunk being computed, prefetched
        weights += 2 * model.dtype_bytes * max(costs.params[rank] / max(1, _layers_on(layout, rank)), 0)
    tensors = weights + params * (state.grads + state.optimizer) + activations
    return RankMemory(
        weights=weights,
        grads=params * state.grads,
        optimizer=params * state.optimizer,
        activations=activations,
        other=memory.other_bytes(tensors),
    )


def _layers_on(layout: Layout, rank: int) -> int:
    return sum(end - start for start, end in layout.stage_layers[rank])
