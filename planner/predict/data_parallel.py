"""The data-parallel and optimizer part of a step: gradient reduction, parameter gathers, the
update, and what of it the backward does not hide."""

from __future__ import annotations

from planner.cost import memory
from planner.cost import step as step_costs
from planner.cost.comm import grad_bucket_count
from planner.cost.fp8_casts import te_weight_casts, writes_transposes
from planner.cost.model import CostModel
from planner.cost.options import DataParallelOptions
from planner.cost.overlap import comm_sm_fraction, overlapped_extra_time
from planner.layout import Layout
from planner.pipeline import ChunkCosts
from planner.predict.shards import (
    dp_equivalent_params,
    dp_shards,
    fsdp_root_params,
    layers_on,
    layout_shard,
    two_replicas,
)
from planner.runtimes.megatron_exchange import reduces_per_chunk
from planner.schedule import head_rank


def replica_sync_times(model: CostModel, layout: Layout, costs: ChunkCosts) -> list[float]:
    """Per pipeline rank, the seconds after its data-parallel reduction that Chimera's
    gradient all-reduce between the two replicas of each of its stages takes (rank r and
    rank P-1-r hold the same two model stages, one per direction; Li & Hoefler 2021, section
    3.4), on the rank's gradient shard under a sharded optimizer (the dense parameters' over
    DP x CP, the routed experts' over EDP); zeros for other schedules."""
    if not two_replicas(layout):
        return [0.0] * layout.pp
    shards = dp_shards(layout) if layout.zero_stage >= 1 else 1
    experts = costs.expert_params or [0.0] * layout.pp
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp) if any(experts) else 1
    owned = [dp_equivalent_params(layout.zero_stage, shards, edp, p, e) / shards for p, e in zip(costs.params, experts)]
    stride = layout.tp * layout.cp * layout.dp
    return [model.network.all_reduce(params * model.options.data.grad_reduce_bytes, 2, stride) for params in owned]


def tied_embedding_done(model: CostModel, layout: Layout, done: list[float]) -> float:
    """When the tied word embedding's gradient all-reduce between the first pipeline rank and
    the one holding the head ends (0 when the model does not tie them or one rank holds both)."""
    last = head_rank(layout.schedule, layout.pp, layout.vpp)
    if not model.spec.tie_embeddings or last == 0:
        return 0.0
    spec = model.spec
    # DeepSpeed's BF16_Optimizer all-reduces the fp32 `weight._hp_grad` (pipe/engine.py
    # `_exec_reduce_tied_grads`), whatever the DP reduction's communication dtype
    grad_bytes = memory.BYTES_FP32 if model.options.data.bf16_optimizer else model.options.data.grad_reduce_bytes
    reduce = step_costs.tied_embedding_time(
        model.network, spec.vocab_size, spec.hidden_size, grad_bytes, layout.tp, layout.cp, layout.dp, layout.pp
    )
    return max(done[0], done[last]) + reduce


def after_backward_times(
    model: CostModel, layout: Layout, params: list[float], expert_params: list[float] | None = None
) -> dict[str, float]:
    """Seconds of the step's synchronised tail after the gradients are reduced, slowest rank
    each: where the runtime has them, the DDP's copies of the gradients around the all-reduce
    and the cast of 16-bit gradients into fp32 main gradients; fp16's loss-scale check, the
    gradient norm, the Adam step (planner/cost/step.py), over the parameters each GPU owns
    (routed experts' sharded over EDP)."""
    compute, net, shape = model.analytic, model.network, (layout.tp, layout.cp, layout.dp, layout.pp)
    experts = expert_params or [0.0] * len(params)
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp)
    most = max(dp_equivalent_params(layout.zero_stage, dp_shards(layout), edp, p, e) for p, e in zip(params, experts))
    opts = model.options
    return {
        **(
            {
                "ddp_grad_copies": step_costs.ddp_grad_copy_time(
                    compute, most, opts.data.grad_reduce_bytes, opts.data.ddp_grad_copy_passes
                )
            }
            if opts.data.ddp_grad_copy_passes
            else {}
        ),
        **(
            {"main_grad_cast": step_costs.main_grad_cast_time(compute, most, layout.zero_stage, dp_shards(layout))}
            if opts.data.main_grad_cast
            else {}
        ),
        "loss_scale_check": step_costs.loss_scale_time(
            compute, net, model.options.kernels.dtype, most, *shape, layout.zero_stage
        ),
        "grad_norm": step_costs.grad_norm_time(
            compute, net, most, *shape, layout.zero_stage, model.options.data.optimizer_kernels
        ),
        "optimizer": optimizer_time(model, layout.zero_stage, dp_shards(layout), most),
        **({"fp8_weight_casts": fp8_weight_cast_time(model, layout)} if opts.kernels.te_fp8 else {}),
    }


def fp8_weight_cast_time(model: CostModel, layout: Layout) -> float:
    """Seconds of the step's one cast of the busiest rank's block weights into fp8 and their
    transposes (Transformer Engine on the first micro-batch: planner/cost/fp8_casts.py)."""
    shard = layout_shard(layout, seq=1)  # the weights' shapes do not depend on the micro-batch's
    nbytes, kernels = te_weight_casts(
        model.spec, shard, writes_transposes(model.cluster.gpu), model.options.kernels.fp8_recipe
    )
    layers = max(layers_on(layout, rank) for rank in range(layout.pp))
    return model.analytic.elementwise_time(layers * nbytes, layers * kernels)


def exposed_dp_times(model: CostModel, layout: Layout, costs: ChunkCosts) -> list[float]:
    """Per pipeline rank, the seconds its data-parallel communication adds after its last
    compute action (`exposed_dp_time`)."""
    return [exposed_dp_time(model, layout, costs, r) for r in range(layout.pp)]


def exposed_dp_time(model: CostModel, layout: Layout, costs: ChunkCosts, rank: int) -> float:
    """Gradient reduce-scatter (all-reduce without a sharded optimizer) and parameter
    all-gather of the rank's weights over the DP x CP group (its routed experts' over their
    expert data-parallel group, EDP ranks at stride ETP x EP, in buckets of their own as
    Megatron's expert gradient buffer), minus what their buckets hide.

    Megatron-LM reduces only in the last micro-batch's backward: its buckets (Megatron's
    default size, `megatron_bucket_params`) fill in reverse layer order and each is reduced as
    soon as its grads are ready, one after another; the first waits for one bucket's share of
    the rank's backward, the last (on the first rank at least the word embedding, which
    Megatron gives its own bucket when shared) is exposed after it
    (`step.exposed_after_window`). Under Megatron's DDP and distributed optimizer (ZeRO 0
    and 1) pipeline ranks after the first hold one bucket ("not on the critical path":
    megatron/core/distributed/distributed_data_parallel.py), so their reduction starts after
    their last backward, which ends before the first rank's; ZeRO-2/3 runtimes (DeepSpeed,
    FSDP) bucket every rank; FSDP's last reduce-scatter, and the all-gather that opens the
    forward, are its root unit's (`fsdp_root_params`: the embedding, final norm and head). The
    overlapped parameter all-gather mirrors it over the first micro-batch's forward."""
    shards = dp_shards(layout)
    experts = costs.expert_params[rank] if costs.expert_params else 0.0
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp) if experts else 1
    if shards == 1 and edp == 1:
        return 0.0
    net, opts = model.network, model.options
    if _per_chunk_grad_sync(layout, opts.data, experts > 0):
        return interleaved_dp_exposed(model, layout, costs, rank)
    params = costs.params[rank]
    root = fsdp_root_params(model, layout, rank) if layout.zero_stage == 3 else 0.0
    groups = [(params - experts, shards, layout.tp, root > 0)]  # FSDP's root unit: a dense unit of its own
    if experts:
        groups.append((experts, edp, layout.ep * layout.expert_tp, False))
    reduce = gather = 0.0
    calls = 0
    whole_buffer = layout.zero_stage == 1 and opts.data.zero1_exchange == "all_reduce_all_gather"
    for group_params, group_shards, stride, with_root in groups:
        if group_shards == 1 or group_params <= 0:
            continue
        n = 1 if whole_buffer else _dp_calls(layout, rank, group_params, opts.data, group_shards) + with_root
        calls += n
        grad_bytes = group_params * opts.data.grad_reduce_bytes / n
        param_bytes = group_params * model.dtype_bytes / n
        broadcast = layout.zero_stage == 1 and opts.data.zero1_exchange == "all_reduce_broadcast"
        if layout.zero_stage == 0 or broadcast or whole_buffer or (layout.zero_stage == 1 and opts.data.bf16_optimizer):
            reduce += n * net.all_reduce(grad_bytes, group_shards, stride)
        else:
            reduce += n * net.reduce_scatter(grad_bytes, group_shards, stride)
        if broadcast:  # each rank's updated shard, one broadcast per rank, one after another
            shard_bytes = group_params * model.dtype_bytes / group_shards
            gather += group_shards * net.broadcast(shard_bytes, group_shards, stride)
        elif layout.zero_stage > 0:  # BF16_Optimizer, nanotron: all-reduce, then the sharded step's all-gather
            gather += n * net.all_gather(param_bytes, group_shards, stride)
    if not calls:
        return 0.0
    if whole_buffer:  # after the backward and after the step, nothing to hide behind
        return reduce + gather
    bucket = edge = params / calls
    if rank == 0 and layout.zero_stage < 3:  # the last bucket holds at least the word embedding
        edge = min(params, max(bucket, memory.embedding_param_count(model.spec, layout.tp)))
    if root:  # FSDP's root unit: its all-gather opens the forward, its reduce-scatter closes the backward
        bucket, edge = (params - root) / max(1, calls - 1), root
    if layout.zero_stage == 3:  # FSDP frees the gathered weights after the forward and
        reduce += gather  # gathers them again for the backward (Rajbhandari et al. 2020: 3x)
    backward = costs.segments * (sum(costs.backward_input_s[rank]) + sum(costs.backward_weight_s[rank]))
    forward = costs.segments * sum(costs.forward_s[rank])
    sm_share = comm_sm_fraction(model.cluster.gpu.efficiency, opts.cluster.interference)
    last_share = min(1.0, edge / params) if params else 0.0

    def overlapped(total: float, window: float) -> float:
        stream = step_costs.exposed_after_window(total, window, params, bucket, edge)
        return max(stream, overlapped_extra_time(total, window, sm_share, total * last_share))

    exposed = overlapped(reduce, backward) if opts.data.overlap_grad_reduce else reduce
    if gather:
        exposed += overlapped(gather, forward) if opts.data.overlap_param_gather else gather
    return exposed + _earlier_microbatch_collectives(layout, reduce, gather, forward, backward, sm_share)


def _earlier_microbatch_collectives(
    layout: Layout, reduce: float, gather: float, forward: float, backward: float, sm_share: float
) -> float:
    """ZeRO-3 without pipelining runs its collectives in every micro-batch, not only in the
    step's first forward and last backward: FSDP frees the gathered weights after each forward
    and backward (FULL_SHARD, reshard_after_forward) and gathers them again in the next
    micro-batch, and reduce-scatters each micro-batch's gradients unless the trainer enters
    `no_sync()`: composer's `ddp_sync_context` (composer/trainer/dist_strategy.py, v0.16.3)
    returns at once unless `state.model` is a DistributedDataParallel, and under FSDP it is the
    ComposerModel whose children `prepare_fsdp_module` wrapped, so every micro-batch
    reduce-scatters; DeepSpeed ZeRO-3 reduces every micro-step too. Each of the m - 1 earlier
    micro-batches overlaps its all-gather with its forward and its all-gather and reduce-scatter
    with its backward: the slowdown they cause there, or what outlasts the compute. torchtitan with
    pipelining keeps the weights gathered across micro-batches (reshard_after_forward False),
    so ranks of a pipeline are not charged."""
    if layout.zero_stage != 3 or layout.pp > 1 or layout.num_microbatches == 1:
        return 0.0
    per_microbatch = overlapped_extra_time(gather, forward, sm_share) + overlapped_extra_time(
        reduce, backward, sm_share
    )
    return (layout.num_microbatches - 1) * per_microbatch


def fsdp_copy_time(model: CostModel, layout: Layout, params: float, rank: int) -> float:
    """Seconds FSDP's copy kernels add to pipeline rank `rank`'s compute stream in a step: FSDP2's
    (`step.fsdp2_copy_time`) one all-gather in each micro-batch's forward and backward and one
    reduce-scatter per micro-batch without pipelining; with it (torchtitan then keeps the weights
    gathered, reshard_after_forward False) one of each per step. FSDP1's (`fsdp1_grad_cat`,
    `step.fsdp1_grad_cat_time`): the flat gradient's assembly in each micro-batch's backward.
    One FSDP unit per transformer layer and the root's (the embedding, final norm and head). 0
    unless ZeRO-3 runs as FSDP2 or with FSDP1's gradient assembly."""
    opts = model.options
    if not (opts.data.fsdp2 or opts.data.fsdp1_grad_cat) or layout.zero_stage != 3 or dp_shards(layout) == 1:
        return 0.0
    m = layout.num_microbatches if layout.pp == 1 else 1
    calls = layers_on(layout, rank) + (fsdp_root_params(model, layout, rank) > 0)
    if opts.data.fsdp1_grad_cat:
        return step_costs.fsdp1_grad_cat_time(model.analytic, params, model.dtype_bytes, reduces=m, calls=calls)
    return step_costs.fsdp2_copy_time(
        model.analytic, params, model.dtype_bytes, opts.data.grad_reduce_bytes, gathers=2 * m, reduces=m, calls=calls
    )


def _per_chunk_grad_sync(layout: Layout, data: DataParallelOptions, has_experts: bool) -> bool:
    """Whether the rank's reduction is charged chunk by chunk: Megatron's interleaved 1F1B with
    overlapped reduction and its own exchange (ZeRO 0-2 with the reduce-scatter; FSDP is charged
    per layer, a per-rank broadcast exchange whole). A rank holding routed experts reduces two
    groups (DP x CP and EDP), which `interleaved_dp_exposed` does not model: it is charged whole,
    as without interleaving."""
    return (
        reduces_per_chunk(layout.schedule, layout.vpp)
        and data.overlap_grad_reduce
        and data.zero1_exchange == "reduce_scatter"
        and layout.zero_stage < 3
        and not has_experts
    )


def interleaved_dp_exposed(model: CostModel, layout: Layout, costs: ChunkCosts, rank: int) -> float:
    """Exposed DP communication of `rank` under Megatron's interleaved 1F1B, chunk by chunk.

    megatron/core/pipeline_parallel/schedules.py (interleaved, `align_grad_reduce` and
    `align_param_gather`, Megatron-LM's defaults) launches the gradient reduction of model
    chunk c once the backward of its last micro-batch has run and `rank` more backward steps
    after it (`grad_sync_microbatch_id = virtual_microbatch_id - pipeline_parallel_rank`),
    the whole chunk at once (chunks after the first are one bucket: `per_chunk_disable_bucketing`
    in megatron/training/training.py); backward steps then go through the chunks in groups of
    `min(P, M)` micro-batches (`microbatch_group_size_per_vp_stage`, default P), chunk V-1
    first. So chunk c has group x (backward of chunks 0..c-1) - rank x (chunk c-1's backward)
    of compute left to hide behind, and chunk 0 none: its reduction is exposed. The parameter
    all-gathers mirror it: chunks 0 and 1 are launched at the step's start, chunk c >= 2
    `rank` forward steps before chunk c-1's first forward, each needed by its chunk's first
    forward after group x (forward of chunks 0..c-1). One stream runs them in order
    (`step.serial_stream_ends`); bubbles, which only lengthen the windows, are not counted.
    The hidden part slows the compute beside it by the collective's SM share
    (planner/cost/overlap.py)."""
    net, opts = model.network, model.options
    shards, stride = dp_shards(layout), layout.tp
    vpp, group = layout.vpp, min(layout.pp, layout.num_microbatches)
    backward = [i + w for i, w in zip(costs.backward_input_s[rank], costs.backward_weight_s[rank], strict=True)]
    forward = costs.forward_s[rank]
    reduce, gather = [], []
    for chunk, params in enumerate(costs.chunk_params[rank]):
        calls = max(
            1,
            grad_bucket_count(
                params,
                shards,
                rank if chunk == 0 else 1,
                True,
                every_rank=layout.zero_stage == 2,
                bucket_params=opts.data.grad_bucket_params,
            ),
        )
        grad_bytes, param_bytes = params * opts.data.grad_reduce_bytes / calls, params * model.dtype_bytes / calls
        if layout.zero_stage == 0:
            reduce.append(calls * net.all_reduce(grad_bytes, shards, stride) if params else 0.0)
            gather.append(0.0)
        else:
            reduce.append(calls * net.reduce_scatter(grad_bytes, shards, stride) if params else 0.0)
            gather.append(calls * net.all_gather(param_bytes, shards, stride) if params else 0.0)
    lag = min(rank, group)
    windows = [max(0.0, group * sum(backward[:c]) - lag * backward[c - 1]) if c else 0.0 for c in range(vpp)]
    order = sorted(range(vpp), key=lambda c: -windows[c])
    ends = step_costs.serial_stream_ends([-windows[c] for c in order], [reduce[c] for c in order])
    sm_share = comm_sm_fraction(model.cluster.gpu.efficiency, opts.cluster.interference)
    exposed = overlapped_extra_time(sum(reduce), group * sum(backward), sm_share, max(0.0, ends[-1]))
    if sum(gather):
        deadlines = [group * sum(forward[:c]) for c in range(vpp)]
        launches = [max(0.0, deadlines[c - 1] - lag * forward[c - 2]) if c >= 2 else 0.0 for c in range(vpp)]
        ends = step_costs.serial_stream_ends(launches, gather)
        late = max(0.0, *(end - due for end, due in zip(ends, deadlines, strict=True)))
        if opts.data.overlap_param_gather:
            exposed += overlapped_extra_time(sum(gather), group * sum(forward), sm_share, late)
        else:
            exposed += sum(gather)
    return exposed


def _dp_calls(layout: Layout, rank: int, params: float, data: DataParallelOptions, shards: int) -> int:
    """Collective calls of one DP reduction over `shards` ranks: FSDP reduces each layer on its own (and its root
    unit: `exposed_dp_time`); Megatron-LM's DDP one per bucket (`grad_bucket_count`,
    planner/cost/comm/buckets.py, of the runtime's bucket size) on the first pipeline rank and,
    under ZeRO-2, on every rank; one bucket on the others and without overlap."""
    if layout.zero_stage == 3:
        return max(1, layers_on(layout, rank))
    return max(
        1,
        grad_bucket_count(
            params,
            shards,
            rank,
            data.overlap_grad_reduce,
            every_rank=layout.zero_stage == 2,
            bucket_params=data.grad_bucket_params,
        ),
    )


def optimizer_time(model: CostModel, zero_stage: int, dp_shards: int, params: float) -> float:
    """The Adam step over the parameters this GPU owns, as multi-tensor kernels, and the copy
    of the updated fp32 main parameters into the model's (planner/cost/step.py)."""
    return step_costs.adam_time(model.analytic, params, zero_stage, dp_shards, model.options.data.optimizer_kernels)
