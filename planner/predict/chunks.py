"""Per pipeline chunk, the compute, communication and memory the schedule simulator runs on."""

from __future__ import annotations

from functools import partial

from planner.cost import memory
from planner.cost.grad_accum import autograd_accumulation_s, fp32_buffer_add_s, hp_grad_add_s
from planner.cost.model import CostModel, LayerCosts
from planner.cost.segments import segment_layer_costs
from planner.cost.shapes import Shard
from planner.layout import Layout
from planner.pipeline import ChunkCosts
from planner.predict.moe_pairing import (
    combined_1f1b_excess,
    pairs_moe_comm,
    unpaired_share,
)
from planner.predict.shards import (
    dp_shards,
    kind_counts,
    layout_shard,
    replica_ends,
    two_replicas,
)
from planner.runtimes.megatron_exchange import exchange_program, megatron_send_mode
from planner.schedule import head_rank
from planner.schedule.registry import SCHEDULES


def chunk_costs(model: CostModel, layout: Layout, seq: int) -> ChunkCosts:
    """Per (rank, chunk) forward / backward-input / backward-weight seconds, saved
    activation bytes per micro-batch (per mean segment under seq1f1b), transient bytes,
    parameters, and the p2p time (held inside the sending chunks' times when the runtime's
    pipeline sends block). Each chunk's blocks are costed as what they are (an MoE model's
    dense-MLP layers apart); the multi-token-prediction modules ride with the head (with each
    head under chimera). Where autograd accumulates the weight gradients, each chunk's
    backward-weight time carries its mean per-micro-batch add, and under DeepSpeed's BF16_Optimizer
    its add of the bf16 gradients into the fp32 accumulators (planner/cost/grad_accum.py)."""
    spec = model.spec
    shard = layout_shard(layout, seq)
    pp, vpp, k = layout.pp, layout.vpp, layout.segments
    paired = pairs_moe_comm(model, layout)
    layer_costs = unit_layer_costs(model, layout)
    split = SCHEDULES[layout.schedule].split_backward and pp > 1
    paired_blocks = {
        (kind, mode): _block_terms(layer_costs(kind, shard, mode, paired), split)
        for kind in set(model.block_kinds)
        for mode in set(layout.recompute)
    }
    alone_blocks = (
        {(kind, mode): _block_terms(layer_costs(kind, shard, mode, False), split) for kind, mode in paired_blocks}
        if paired
        else paired_blocks
    )
    embedding, head = layer_costs("embedding", shard), layer_costs("head", shard)
    fwd, bwd_in, bwd_w, act, chunk_params = [], [], [], [], []
    extra, params, tp_comm, experts = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
    for rank, per_rank in enumerate(layout.stage_layers):
        mode = layout.recompute[rank]
        alone = unpaired_share(model, layout, rank) if paired else 0.0
        blocks = (
            {key: _blend(terms, alone_blocks[key], alone) for key, terms in paired_blocks.items()}
            if alone
            else paired_blocks
        )
        row_fwd, row_in, row_w, row_act, row_params = [], [], [], [], []
        for start, end in per_rank:
            f = b = w = a = held = 0.0
            for kind, n in kind_counts(model, start, end):
                forward, backward, weight, saved, count, expert_count, comm, peak_extra = blocks[kind, mode]
                f += n * forward
                b += n * backward
                w += n * weight
                a += n * saved
                held += n * count
                experts[rank] += n * expert_count
                tp_comm[rank] += n * comm
                if peak_extra > extra[rank]:
                    extra[rank] = peak_extra
            row_fwd.append(f)
            row_in.append(b)
            row_w.append(w)
            row_act.append(a)
            row_params.append(held)
            params[rank] += held
        fwd.append(row_fwd)
        bwd_in.append(row_in)
        bwd_w.append(row_w)
        act.append(row_act)
        chunk_params.append(row_params)
    last_rank = head_rank(layout.schedule, pp, vpp)
    ends = [(embedding, 0, 0), (head, last_rank, vpp - 1), *replica_ends(layout, embedding, head)]
    ends += [
        (layer_costs("mtp", shard, layout.recompute[rank], paired), rank, chunk)
        for rank, chunk in mtp_places(model, layout)
    ]
    for costs, rank, chunk in ends:
        comm_backward = costs.comm_backward_s + (costs.split_backward_comm_s if split else 0.0)
        fwd[rank][chunk] += costs.forward_s + costs.comm_forward_s
        bwd_in[rank][chunk] += costs.backward_input_s + comm_backward
        bwd_w[rank][chunk] += costs.backward_weight_s
        act[rank][chunk] += costs.activation_bytes
        params[rank] += costs.param_count
        chunk_params[rank][chunk] += costs.param_count
        experts[rank] += costs.expert_param_count
        tp_comm[rank] += costs.comm_forward_s + comm_backward
        extra[rank] = max(extra[rank], costs.peak_extra_bytes)
    if spec.tie_embeddings and last_rank == 0 and not two_replicas(layout):
        params[0] -= spec.vocab_size * spec.hidden_size / layout.tp
        chunk_params[0][vpp - 1] -= spec.vocab_size * spec.hidden_size / layout.tp
    if spec.mtp_depth and last_rank == 0 and not two_replicas(layout):
        params[0] -= embedding.param_count  # the MTP modules share the first rank's embedding
        chunk_params[0][vpp - 1] -= embedding.param_count
    if paired is True:
        for rank, excess in enumerate(combined_1f1b_excess(model, layout, seq)):
            per_pass = excess / (2 * vpp * k)  # spread over the rank's forward and backward passes
            fwd[rank] = [t + per_pass for t in fwd[rank]]
            bwd_in[rank] = [t + per_pass for t in bwd_in[rank]]
            tp_comm[rank] += excess / k
    if model.options.data.wgrad_accumulation in ("autograd", "fp32_buffer") or model.options.data.bf16_optimizer:
        for rank, row in enumerate(chunk_params):
            for chunk, held in enumerate(row):
                bwd_w[rank][chunk] += _grad_accumulation_s(model, held, layout.num_microbatches) / k
    if model.options.pipeline.p2p_mode in ("deepspeed", "deepspeed-whole-grads") and pp > 1 and k == 1:
        _add_pipe_engine_buffers(model, layout, shard, act, extra, last_rank)
    p2p_bytes = model.dtype_bytes * shard.local_tokens / k * spec.hidden_size / layout.tp
    p2p_s = model.network.p2p(p2p_bytes, pp, layout.tp * layout.cp * layout.dp) if pp > 1 else 0.0
    hold_fwd, hold_bwd = send_holds(model, layout, p2p_bytes) if pp > 1 else (0.0, 0.0)
    blocking = p2p_mode(model, layout) == "blocking"
    return ChunkCosts(
        forward_s=fwd,
        backward_input_s=bwd_in,
        backward_weight_s=bwd_w,
        activation_bytes=act,
        extra_bytes=extra,
        params=params,
        tp_comm_s=tp_comm,
        chunk_params=chunk_params,
        expert_params=experts,
        p2p_s=0.0 if hold_fwd or hold_bwd else p2p_s,  # a blocking hold contains the transfer
        send_hold_forward_s=hold_fwd,
        send_hold_backward_s=hold_bwd,
        exchanges=exchange_program(layout.schedule, pp, layout.num_microbatches) if blocking else None,
        segments=k,
        cached_segment_bytes=_bf16_optimizer_segments(model, layout, shard, params, last_rank),
    )


def _grad_accumulation_s(model: CostModel, params: float, microbatches: int) -> float:
    """Mean seconds per micro-batch the runtime spends accumulating the weight gradients of
    `params` parameters outside the GEMMs: autograd's add into `.grad`, nanotron's and DeepSpeed's
    BF16_Optimizer's adds into their fp32 accumulators (planner/cost/grad_accum.py)."""
    opts, seconds = model.options, 0.0
    if opts.data.wgrad_accumulation == "autograd":
        seconds += autograd_accumulation_s(model.analytic, params, model.dtype_bytes, microbatches)
    if opts.data.wgrad_accumulation == "fp32_buffer":
        seconds += fp32_buffer_add_s(model.analytic, params)
    if opts.data.bf16_optimizer:
        seconds += hp_grad_add_s(model.analytic, params)
    return seconds


def _add_pipe_engine_buffers(
    model: CostModel, layout: Layout, shard: Shard, act: list[list[float]], extra: list[float], last_rank: int
) -> None:
    """Add DeepSpeed PipelineEngine's own buffers (`memory.deepspeed_pipe_buffer_bytes`) to each
    rank's per-micro-batch activation bytes (its last chunk's) and its transient bytes."""
    for rank in range(layout.pp):
        held, fixed = memory.deepspeed_pipe_buffer_bytes(
            shard, model.spec.hidden_size, model.dtype_bytes, first=rank == 0, last=rank == last_rank
        )
        act[rank][-1] += held
        extra[rank] += fixed


def _bf16_optimizer_segments(
    model: CostModel, layout: Layout, shard: Shard, params: list[float], last_rank: int
) -> list[float] | None:
    """Per rank, the allocator segments DeepSpeed's BF16_Optimizer's transients add
    (`memory.bf16_optimizer_transients`, `memory.new_segment_bytes`); None without it."""
    opts = model.options
    if not opts.data.bf16_optimizer or layout.zero_stage > 1:
        return None
    spec = model.spec
    largest_tensor = memory.largest_activation_tensor(spec, shard, opts.kernels.flash_attention)
    segments = []
    for rank in range(layout.pp):
        largest = memory.largest_param_count(spec, layout.tp, embedding=rank == 0, head=rank == last_rank)
        transients = memory.bf16_optimizer_transients(largest, params[rank], opts.data.grad_reduce_bytes)
        freed = memory.bf16_optimizer_freed_before(params[rank], dp_shards(layout), largest_tensor)
        segments.append(memory.new_segment_bytes(transients, freed))
    return segments


def _blend(paired: tuple[float, ...], alone: tuple[float, ...], alone_share: float) -> tuple[float, ...]:
    """Per-layer terms when `alone_share` of the passes run unpaired."""
    return tuple(p + alone_share * (a - p) for p, a in zip(paired, alone))


def _block_terms(block: LayerCosts, split: bool) -> tuple[float, float, float, float, float, float, float, float]:
    """What `chunk_costs` adds per layer of a block: forward and backward-input seconds with
    their TP/CP communication (with the weight gradients a pass of their own when `split`),
    backward-weight seconds, activation bytes, parameters, routed expert parameters, TP/CP
    communication seconds and transient bytes."""
    comm_backward = block.comm_backward_s + (block.split_backward_comm_s if split else 0.0)
    return (
        block.forward_s + block.comm_forward_s,
        block.backward_input_s + comm_backward,
        block.backward_weight_s,
        block.activation_bytes,
        block.param_count,
        block.expert_param_count,
        block.comm_forward_s + comm_backward,
        block.peak_extra_bytes,
    )


def unit_layer_costs(model: CostModel, layout: Layout):
    """The layer-cost callable of the layout's pipelined unit, `(kind, shard, recompute,
    paired) -> LayerCosts`: the cost model's for whole micro-batches, the mean sequence
    segment's under seq1f1b (`segment_layer_costs`)."""
    if layout.segments == 1:
        return model.layer_costs
    return partial(segment_layer_costs, model, segments=layout.segments)


def mtp_places(model: CostModel, layout: Layout) -> tuple[tuple[int, int], ...]:
    """(rank, chunk) of each copy of the multi-token-prediction modules: beside the head, and
    beside chimera's second head (the down pipeline's, rank P-1 chunk 0); none without MTP."""
    if not model.spec.mtp_depth:
        return ()
    head = (head_rank(layout.schedule, layout.pp, layout.vpp), layout.vpp - 1)
    return (head, (layout.pp - 1, 0)) if two_replicas(layout) else (head,)


def p2p_mode(model: CostModel, layout: Layout) -> str:
    """The layout's pipeline send mode, CostOptions.pipeline.p2p_mode with "megatron-lm" resolved:
    "blocking" in plain 1F1B, "overlapped" in interleaved 1F1B."""
    mode = model.options.pipeline.p2p_mode
    return megatron_send_mode(layout.schedule, layout.vpp) if mode == "megatron-lm" else mode


def send_holds(model: CostModel, layout: Layout, p2p_bytes: float) -> tuple[float, float]:
    """Seconds a rank's stream is held after a forward, and after a backward, that sends to
    another pipeline rank, under the runtime's `p2p_mode` (0, 0 when sends overlap compute).

    "blocking" (Megatron-LM): the send and the matching receive of the opposite direction run
    together (one batch_isend_irecv) with 1/TP of the activation each, then, without sequence
    parallelism, the received part is all-gathered over TP (gather_split_1d_tensor).
    "deepspeed": send and receive one after the other, the activation and the gradient each as
    its 1/TP part; the activation is all-gathered over TP on arrival (forward), the stage output
    and the received gradient before the backward (_exec_backward_pass).
    "deepspeed-whole-grads" (before v0.5.4): the gradient sent whole, the stage output restored
    by one all-gather when it arrives (_exec_recv_grads).
    "megatron-lm": "blocking" in plain 1F1B, "overlapped" in interleaved 1F1B (CostOptions)."""
    mode, tp = p2p_mode(model, layout), layout.tp
    if mode == "overlapped":
        return 0.0, 0.0
    net, stride = model.network, layout.tp * layout.cp * layout.dp
    part = net.p2p(p2p_bytes, layout.pp, stride)
    gather = net.all_gather(p2p_bytes * tp, tp, 1) if tp > 1 and not layout.sequence_parallel else 0.0
    if mode == "blocking":
        return part + gather, part + gather
    if mode == "deepspeed":
        return part + part + 2 * gather, part + part + gather
    whole = net.p2p(p2p_bytes * tp, layout.pp, stride)
    return part + whole + gather, whole + part + gather
