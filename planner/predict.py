"""Predict one layout: per-chunk costs from the cost model, the pipeline schedule's timing,
data-parallel communication and the per-step work after the backward, memory per pipeline rank.

    grads = max(max_r(finish_r + exposed_dp_r), max(done_0, done_last) + tied_embedding)
    step  = grads + max_r(loss_scale_r) + max_r(grad_norm_r) + max_r(optimizer_r)

finish_r is when pipeline rank r ends its last compute action in the schedule simulation (the
simulator charges the p2p time, latency plus bytes over bandwidth, on every cross-rank
dependency, the warm-up's P - 1 hops included; when the runtime's sends block, the sending
action holds its rank for it instead: `send_holds`, CostOptions.pipeline.p2p_mode); exposed_dp_r
is the part of its gradient reduction (and, with a distributed optimizer, the parameter
all-gather) that its buckets cannot hide behind the last micro-batch's backward (first
micro-batch's forward), one collective call per Megatron-LM DDP bucket (FSDP: per layer), each
paying its own latency, or, when longer, the slowdown the overlapped part causes in that
compute (planner/cost/overlap.py); under Megatron's interleaved 1F1B each model chunk is
reduced on its own once its last micro-batch's backward has run (`interleaved_dp_exposed`);
done_r = finish_r + exposed_dp_r. The tied embedding's all-reduce, fp16's loss-scale check,
the gradient norm and the Adam step are planner/cost/step.py's. Each term is a key of
`time_breakdown_s`, whose values sum to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial

from planner.cost import memory, step as step_costs
from planner.cost.comm import grad_bucket_count
from planner.cost.grad_accum import autograd_accumulation_s, hp_grad_add_s
from planner.cost.model import DENSE_BLOCK, DUALPIPEV_PAIRING, CostModel, CostOptions, LayerCosts
from planner.cost.segments import attention_share, segment_fractions, segment_layer_costs
from planner.cost.overlap import combined_1f1b_step_excess, comm_sm_fraction, overlapped_extra_time
from planner.cost.shapes import Shard, model_flops_per_token
from planner.layout import Layout
from planner.pipeline import ChunkCosts, PipelineTiming, pipeline_timing
from planner.plan import MemoryBreakdown, Predicted
from planner.runtimes.megatron_exchange import exchange_program
from planner.schedule import head_rank
from planner.schedule.registry import SCHEDULES
from planner.schedule.seq1f1b import weighted_inflight
from planner.spec import ModelSpec
from planner.units import GiB


def pairs_moe_comm(model: CostModel, layout: Layout) -> bool | str:
    """Whether the layout's schedule hides each micro-batch's MoE all-to-all behind another's
    compute, as `CostModel.layer_costs`'s `paired` takes it: DUALPIPEV_PAIRING for DualPipeV
    with a pipeline (its own whole-pass overlap, whatever `moe_ep_overlap` says), True where
    Megatron's combined 1F1B runs the layout (`runs_combined_1f1b`), else False."""
    if SCHEDULES[layout.schedule].paired:
        return DUALPIPEV_PAIRING if layout.pp > 1 else False
    return runs_combined_1f1b(model.options, model.spec, layout)


def runs_combined_1f1b(options: CostOptions, spec: ModelSpec, layout: Layout) -> bool:
    """Whether Megatron's combined 1F1B (`CostOptions.moe.moe_ep_overlap`: --overlap-moe-expert-
    parallel-comm with --delay-wgrad-compute) runs this layout, as megatron-core 0.19.2 decides:
    schedules.py sends training without a pipeline (forward_backward_no_pipelining ->
    combined_1f1b_schedule_for_no_pipelining) and interleaved 1F1B
    (forward_backward_pipelining_with_interleaving -> combined_1f1b_schedule_for_interleaved_
    pipelining) to it, and TransformerConfig.__post_init__ refuses the overlap with PP > 1 and no
    virtual stages, without expert parallelism (EP 1), with full recompute, and with more than
    one MTP layer. Not under DualPipeV (Megatron-LM does not run it; `pairs_moe_comm` pairs it
    on its own)."""
    return combined_1f1b_runs(options, spec, layout.schedule, layout.pp, layout.ep, layout.recompute)


def combined_1f1b_runs(options: CostOptions, spec: ModelSpec, schedule: str, pp: int, ep: int,
                       recompute: tuple[str, ...]) -> bool:
    """`runs_combined_1f1b` of a layout of this schedule, PP and EP whose ranks recompute
    in the modes `recompute` (the search asks with none, then costs a mode `full` unpaired)."""
    if not (options.moe.moe_ep_overlap and spec.is_moe) or SCHEDULES[schedule].paired:
        return False
    if ep == 1 or spec.mtp_depth > 1 or "full" in recompute:
        return False
    return pp == 1 or schedule == "interleaved_1f1b"


def priced_options(options: CostOptions, spec: ModelSpec, layout: Layout) -> dict:
    """The cost options a plan of `layout` was priced with, as PlanEntry fields: its GEMM
    precision, the MoE token dispatcher ("deepep" only where DeepEP's kernels were costed: an
    MoE model with EP > 1) and whether Megatron's combined-1F1B all-to-all overlap was
    (`runs_combined_1f1b`). A dense model records the MoE defaults whatever was asked. The
    attention kernel, always."""
    deepep = options.moe.moe_dispatcher == "deepep" and spec.is_moe and layout.ep > 1
    return {"precision": options.kernels.precision, "moe_dispatcher": "deepep" if deepep else "alltoall",
            "moe_ep_overlap": runs_combined_1f1b(options, spec, layout), "attention": options.kernels.attention}


def unpaired_share(model: CostModel, layout: Layout, rank: int) -> float:
    """Share of a rank's micro-batch passes that Megatron's combined 1F1B runs alone, their
    all-to-all exposed: the warm-up forwards (and as many cool-down backwards) of
    schedules.get_pp_rank_microbatches, 2 (PP - rank - 1) + (V - 1) x PP + 1 of M x V with
    interleaving (microbatch_group_size_per_vp_stage defaults to PP; the + 1 is the extra forward
    the overlap schedules "to ensure the forward and backward computations are independent"),
    and without a pipeline the first forward and the last backward (1 of M). 0 where nothing is
    paired, and under DualPipeV (charged paired throughout)."""
    if not pairs_moe_comm(model, layout) or SCHEDULES[layout.schedule].paired:
        return 0.0
    total = layout.num_microbatches * layout.vpp
    if layout.pp == 1:
        return min(1.0, 1 / layout.num_microbatches)
    warmup = 2 * (layout.pp - rank - 1) + (layout.vpp - 1) * layout.pp + 1
    return min(1.0, warmup / total)


@cache
def combined_1f1b_chunk_pairs(pp: int, vpp: int, microbatches: int, rank: int) -> tuple[tuple[tuple[int, int], int], ...]:
    """(forward model chunk, backward model chunk) of each steady-state combined step on `rank`
    of Megatron's interleaved schedule with the MoE overlap, with how many steps pair them:
    step k runs virtual micro-batch k + W forward beside k backward (W the warm-up of
    `unpaired_share`), each chunk from schedules.get_schedule_table (groups of PP micro-batches,
    `microbatch_group_size_per_vp_stage` defaulting to PP, run through every chunk in turn) and
    get_model_chunk_id (the backward runs the chunks in reverse). Without a pipeline, chunk 0
    beside chunk 0, M - 1 times."""
    total = microbatches * vpp
    if pp == 1:
        return (((0, 0), microbatches - 1),) if microbatches > 1 else ()
    chunk_of = []
    for first in range(0, microbatches, pp):
        group = min(pp, microbatches - first)
        chunk_of += [chunk for chunk in range(vpp) for _ in range(group)]
    warmup = min(total, 2 * (pp - rank - 1) + (vpp - 1) * pp + 1)
    counts: dict[tuple[int, int], int] = {}
    for k in range(total - warmup):
        pair = (chunk_of[k + warmup], vpp - 1 - chunk_of[k])
        counts[pair] = counts.get(pair, 0) + 1
    return tuple(sorted(counts.items()))


def combined_1f1b_excess(model: CostModel, layout: Layout, seq: int) -> list[float]:
    """Per pipeline rank, seconds per micro-batch that Megatron's combined 1F1B takes beyond the
    steady-state per-layer costs: each combined step's joined start and end and the layers of
    the longer chunk that find no partner (planner/cost/overlap.py `combined_1f1b_step_excess`),
    summed over the rank's steady-state steps (`combined_1f1b_chunk_pairs`, each chunk's MoE
    blocks counted) over M. Zeros where the layout does not run combined 1F1B."""
    if not (runs_combined_1f1b(model.options, model.spec, layout) and layout.ep > 1):
        return [0.0] * layout.pp
    layer = model.combined_1f1b_layer(layout_shard(layout, seq))
    out = []
    for rank, per_rank in enumerate(layout.stage_layers):
        moe = [dict(_kind_counts(model, start, end)).get("transformer", 0) for start, end in per_rank]
        pairs = combined_1f1b_chunk_pairs(layout.pp, layout.vpp, layout.num_microbatches, rank)
        total = sum(n * combined_1f1b_step_excess(layer, moe[f], moe[b]) for (f, b), n in pairs)
        out.append(total / layout.num_microbatches)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMemory:
    """Bytes on one pipeline rank at its peak."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float
    """Beyond the tensors: the caching allocator's overhead and what lies outside it."""
    outside_allocator: float = 0.0
    """The part of `other` the caching allocator does not hold (CUDA context, NCCL buffers)."""

    @property
    def allocated(self) -> float:
        """The tensors' bytes (torch.cuda.max_memory_allocated)."""
        return self.weights + self.grads + self.optimizer + self.activations

    @property
    def reserved(self) -> float:
        """The caching allocator's segments (torch.cuda.max_memory_reserved)."""
        return self.total - self.outside_allocator

    @property
    def total(self) -> float:
        """Device memory in use (nvidia-smi): what must fit in the GPU."""
        return self.allocated + self.other


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
            memory_reserved_gb_per_stage=[round(m.reserved / GiB, 3) for m in self.memory],
            memory_allocated_gb_per_stage=[round(m.allocated / GiB, 3) for m in self.memory],
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
    paired_blocks = {(kind, mode): _block_terms(layer_costs(kind, shard, mode, paired), split)
                     for kind in set(model.block_kinds) for mode in set(layout.recompute)}
    alone_blocks = {(kind, mode): _block_terms(layer_costs(kind, shard, mode, False), split)
                    for kind, mode in paired_blocks} if paired else paired_blocks
    embedding, head = layer_costs("embedding", shard), layer_costs("head", shard)
    fwd, bwd_in, bwd_w, act, chunk_params = [], [], [], [], []
    extra, params, tp_comm, experts = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
    for rank, per_rank in enumerate(layout.stage_layers):
        mode = layout.recompute[rank]
        alone = unpaired_share(model, layout, rank) if paired else 0.0
        blocks = ({key: _blend(terms, alone_blocks[key], alone) for key, terms in paired_blocks.items()}
                  if alone else paired_blocks)
        row_fwd, row_in, row_w, row_act, row_params = [], [], [], [], []
        for start, end in per_rank:
            f = b = w = a = held = 0.0
            for kind, n in _kind_counts(model, start, end):
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
    ends = [(embedding, 0, 0), (head, last_rank, vpp - 1), *_replica_ends(layout, embedding, head)]
    ends += [(layer_costs("mtp", shard, layout.recompute[rank], paired), rank, chunk)
             for rank, chunk in mtp_places(model, layout)]
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
    if spec.tie_embeddings and last_rank == 0 and not _two_replicas(layout):
        params[0] -= spec.vocab_size * spec.hidden_size / layout.tp
        chunk_params[0][vpp - 1] -= spec.vocab_size * spec.hidden_size / layout.tp
    if spec.mtp_depth and last_rank == 0 and not _two_replicas(layout):
        params[0] -= embedding.param_count  # the MTP modules share the first rank's embedding
        chunk_params[0][vpp - 1] -= embedding.param_count
    if paired is True:
        for rank, excess in enumerate(combined_1f1b_excess(model, layout, seq)):
            per_pass = excess / (2 * vpp * k)  # spread over the rank's forward and backward passes
            fwd[rank] = [t + per_pass for t in fwd[rank]]
            bwd_in[rank] = [t + per_pass for t in bwd_in[rank]]
            tp_comm[rank] += excess / k
    if model.options.data.wgrad_accumulation == "autograd" or model.options.data.bf16_optimizer:
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
        forward_s=fwd, backward_input_s=bwd_in, backward_weight_s=bwd_w,
        activation_bytes=act, extra_bytes=extra, params=params, tp_comm_s=tp_comm,
        chunk_params=chunk_params, expert_params=experts,
        p2p_s=0.0 if hold_fwd or hold_bwd else p2p_s,  # a blocking hold contains the transfer
        send_hold_forward_s=hold_fwd, send_hold_backward_s=hold_bwd,
        exchanges=exchange_program(layout.schedule, pp, layout.num_microbatches) if blocking else None,
        segments=k,
        cached_segment_bytes=_bf16_optimizer_segments(model, layout, shard, params, last_rank),
    )


def _grad_accumulation_s(model: CostModel, params: float, microbatches: int) -> float:
    """Mean seconds per micro-batch the runtime spends accumulating the weight gradients of
    `params` parameters outside the GEMMs: autograd's add into `.grad`, and DeepSpeed's
    BF16_Optimizer's add into its fp32 accumulators (planner/cost/grad_accum.py)."""
    opts, seconds = model.options, 0.0
    if opts.data.wgrad_accumulation == "autograd":
        seconds += autograd_accumulation_s(model.analytic, params, model.dtype_bytes, microbatches)
    if opts.data.bf16_optimizer:
        seconds += hp_grad_add_s(model.analytic, params)
    return seconds


def _add_pipe_engine_buffers(model: CostModel, layout: Layout, shard: Shard, act: list[list[float]],
                             extra: list[float], last_rank: int) -> None:
    """Add DeepSpeed PipelineEngine's own buffers (`memory.deepspeed_pipe_buffer_bytes`) to each
    rank's per-micro-batch activation bytes (its last chunk's) and its transient bytes."""
    for rank in range(layout.pp):
        held, fixed = memory.deepspeed_pipe_buffer_bytes(
            shard, model.spec.hidden_size, model.dtype_bytes, first=rank == 0, last=rank == last_rank)
        act[rank][-1] += held
        extra[rank] += fixed


def _bf16_optimizer_segments(model: CostModel, layout: Layout, shard: Shard, params: list[float],
                             last_rank: int) -> list[float] | None:
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
        freed = memory.bf16_optimizer_freed_before(params[rank], _dp_shards(layout), largest_tensor)
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
    return (block.forward_s + block.comm_forward_s, block.backward_input_s + comm_backward,
            block.backward_weight_s, block.activation_bytes, block.param_count, block.expert_param_count,
            block.comm_forward_s + comm_backward, block.peak_extra_bytes)


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
    return (head, (layout.pp - 1, 0)) if _two_replicas(layout) else (head,)


def p2p_mode(model: CostModel, layout: Layout) -> str:
    """The layout's pipeline send mode, CostOptions.pipeline.p2p_mode with "megatron-lm" resolved:
    "blocking" in plain 1F1B, "overlapped" in interleaved 1F1B."""
    mode = model.options.pipeline.p2p_mode
    if mode == "megatron-lm":
        return "overlapped" if layout.schedule == "interleaved_1f1b" and layout.vpp > 1 else "blocking"
    return mode


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


def _kind_counts(model: CostModel, start: int, end: int) -> tuple[tuple[str, int], ...]:
    """The block kinds of layers [start, end) and how many of each (none with no layer)."""
    dense = model.dense_layers_before[end] - model.dense_layers_before[start]
    counts = (("transformer", end - start - dense), (DENSE_BLOCK, dense))
    return tuple((kind, n) for kind, n in counts if n)


def _replica_ends(layout: Layout, embedding: LayerCosts, head: LayerCosts) -> tuple[tuple[LayerCosts, int, int], ...]:
    """(costs, rank, chunk) of the embedding and head of Chimera's up pipeline (its stage P,
    the model's first, and the down pipeline's last, both on rank P-1); none otherwise."""
    if not _two_replicas(layout):
        return ()
    return ((embedding, layout.pp - 1, 1), (head, layout.pp - 1, 0))


def _two_replicas(layout: Layout) -> bool:
    """Whether the pipeline ranks hold two copies of the model (chimera's two directions)."""
    return layout.schedule == "chimera" and layout.pp > 1


def layout_shard(layout: Layout, seq: int) -> Shard:
    """The micro-batch shape one GPU of the layout sees."""
    return Shard(mbs=layout.mbs, seq=seq, tp=layout.tp, cp=layout.cp, sequence_parallel=layout.sequence_parallel,
                 ep=layout.ep, etp=layout.etp)


def _block_per_rank(model: CostModel, layout: Layout, seq: int, field: str) -> list[float]:
    """Per pipeline rank, the sum of its transformer layers' `field` in the rank's mode (and
    of its multi-token-prediction modules'), per unit (a mean segment under seq1f1b)."""
    shard, paired = layout_shard(layout, seq), pairs_moe_comm(model, layout)
    layer_costs = unit_layer_costs(model, layout)
    mtp_ranks = [rank for rank, _ in mtp_places(model, layout)]
    out = []
    for rank, per_rank in enumerate(layout.stage_layers):
        mode, alone = layout.recompute[rank], unpaired_share(model, layout, rank) if paired else 0.0

        def term(kind: str) -> float:
            value = getattr(layer_costs(kind, shard, mode, paired), field)
            return value + alone * (getattr(layer_costs(kind, shard, mode, False), field) - value) if alone else value

        total = sum(n * term(kind) for start, end in per_rank for kind, n in _kind_counts(model, start, end))
        if rank in mtp_ranks:
            total += mtp_ranks.count(rank) * getattr(layer_costs("mtp", shard, mode, paired), field)
        out.append(total)
    return out


def predict(model: CostModel, layout: Layout, global_batch: int, seq: int,
            costs: ChunkCosts | None = None) -> Prediction:
    """Step time, throughput, MFU, bubble and memory of `layout` for this job; `costs`, when
    the caller has them, are the layout's `chunk_costs` (the search's, from its bound)."""
    if costs is None:
        costs = chunk_costs(model, layout, seq)
    timing = pipeline_timing(costs, layout.schedule, layout.pp, layout.vpp, layout.num_microbatches)
    pp = layout.pp
    dp_exposed = exposed_dp_times(model, layout, costs)
    copies = [fsdp_copy_time(model, layout, costs.params[r], r) for r in range(pp)]
    sync = replica_sync_times(model, layout, costs)
    done = [timing.finish_s[r] + dp_exposed[r] + copies[r] + sync[r] for r in range(pp)]
    critical = max(range(pp), key=lambda r: done[r])
    grads_done = max(done[critical], _tied_embedding_done(model, layout, done))
    tail = after_backward_times(model, layout, costs.params, costs.expert_params)
    step = grads_done + sum(tail.values())
    tokens = global_batch * seq
    model_flops = model_flops_per_token(model.spec, seq) * tokens
    peak = model.cluster.gpu.peak_flops(model.options.kernels.dtype)
    mfu = model_flops / (step * layout.num_gpus * peak)
    busy = timing.busy_s[critical]
    blocked = timing.blocked_s[critical] if timing.blocked_s else 0.0
    m = layout.num_microbatches * layout.segments  # units of ChunkCosts
    all_to_all = 0.0
    if model.spec.is_moe:
        all_to_all = (m * _block_per_rank(model, layout, seq, "moe_comm_s")[critical]
                      + layout.num_microbatches * combined_1f1b_excess(model, layout, seq)[critical])
    breakdown = {
        "compute": busy - m * costs.tp_comm_s[critical],
        "tp_cp_comm": m * costs.tp_comm_s[critical] - all_to_all,
        **({"moe_all_to_all": all_to_all} if model.spec.is_moe else {}),
        **({"pp_p2p_blocked": blocked} if timing.blocked_s else {}),
        "pipeline_bubble": timing.finish_s[critical] - busy - blocked,
        "dp_comm_exposed": dp_exposed[critical],
        **({"fsdp_copies": copies[critical]} if any(copies) else {}),
        **({"replica_grad_sync": sync[critical]} if _two_replicas(layout) else {}),
        "tied_embedding_grad": grads_done - done[critical],
        **tail,
    }
    return Prediction(
        step_time_s=step,
        tokens_per_s=tokens / step,
        mfu=mfu,
        bubble_fraction=timing.bubble_fraction,
        memory=layout_memory(model, layout, costs, peak_activation_bytes(model, layout, seq, costs, timing)),
        time_breakdown_s=breakdown,
        timing=timing,
    )


def replica_sync_times(model: CostModel, layout: Layout, costs: ChunkCosts) -> list[float]:
    """Per pipeline rank, the seconds after its data-parallel reduction that Chimera's
    gradient all-reduce between the two replicas of each of its stages takes (rank r and
    rank P-1-r hold the same two model stages, one per direction; Li & Hoefler 2021, section
    3.4), on the rank's gradient shard under a sharded optimizer (the dense parameters' over
    DP x CP, the routed experts' over EDP); zeros for other schedules."""
    if not _two_replicas(layout):
        return [0.0] * layout.pp
    shards = _dp_shards(layout) if layout.zero_stage >= 1 else 1
    experts = costs.expert_params or [0.0] * layout.pp
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp) if any(experts) else 1
    owned = [dp_equivalent_params(layout.zero_stage, shards, edp, p, e) / shards for p, e in zip(costs.params, experts)]
    stride = layout.tp * layout.cp * layout.dp
    return [model.network.all_reduce(params * model.options.data.grad_reduce_bytes, 2, stride) for params in owned]


def peak_activation_bytes(model: CostModel, layout: Layout, seq: int, costs: ChunkCosts,
                          timing: PipelineTiming) -> tuple[float, ...]:
    """Per pipeline rank, the most activation bytes it holds at once: the simulator's, but
    under seq1f1b with its segments' unequal lengths (the computation-wise partition,
    planner/cost/segments.py) weighing the held segments."""
    if layout.segments == 1:
        return timing.peak_activation_bytes
    share = attention_share(model, layout_shard(layout, seq), layout.recompute[0], layout.segments)
    held = weighted_inflight(layout.pp, layout.num_microbatches, segment_fractions(layout.segments, share))
    return tuple(held[r] * sum(costs.activation_bytes[r]) for r in range(layout.pp))


def _dp_shards(layout: Layout) -> int:
    return layout.dp * layout.cp


def _tied_embedding_done(model: CostModel, layout: Layout, done: list[float]) -> float:
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
        model.network, spec.vocab_size, spec.hidden_size, grad_bytes,
        layout.tp, layout.cp, layout.dp, layout.pp)
    return max(done[0], done[last]) + reduce


def after_backward_times(model: CostModel, layout: Layout, params: list[float],
                         expert_params: list[float] | None = None) -> dict[str, float]:
    """Seconds of the step's synchronised tail after the gradients are reduced, slowest rank
    each: where the runtime has them, the DDP's copies of the gradients around the all-reduce
    and the cast of 16-bit gradients into fp32 main gradients; fp16's loss-scale check, the
    gradient norm, the Adam step (planner/cost/step.py), over the parameters each GPU owns
    (routed experts' sharded over EDP)."""
    compute, net, shape = model.analytic, model.network, (layout.tp, layout.cp, layout.dp, layout.pp)
    experts = expert_params or [0.0] * len(params)
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp)
    most = max(dp_equivalent_params(layout.zero_stage, _dp_shards(layout), edp, p, e) for p, e in zip(params, experts))
    opts = model.options
    return {
        **({"ddp_grad_copies": step_costs.ddp_grad_copy_time(compute, most, opts.data.grad_reduce_bytes,
                                                             opts.data.ddp_grad_copy_passes)}
           if opts.data.ddp_grad_copy_passes else {}),
        **({"main_grad_cast": step_costs.main_grad_cast_time(compute, most, layout.zero_stage, _dp_shards(layout))}
           if opts.data.main_grad_cast else {}),
        "loss_scale_check": step_costs.loss_scale_time(
            compute, net, model.options.kernels.dtype, most, *shape, layout.zero_stage),
        "grad_norm": step_costs.grad_norm_time(compute, net, most, *shape, layout.zero_stage,
                                               model.options.data.optimizer_kernels),
        "optimizer": optimizer_time(model, layout.zero_stage, _dp_shards(layout), most),
    }


def dp_equivalent_params(zero_stage: int, dp_shards: int, edp: int, params: float, expert_params: float) -> float:
    """`params` with the routed experts among them (`expert_params`) weighted so that a ZeRO
    shard over `dp_shards` (DP x CP) of the result is what the GPU owns: the dense
    parameters' share of DP x CP and the experts' share of their `edp` expert data-parallel
    ranks (Megatron's MoE parallel folding)."""
    if not expert_params or zero_stage == 0:
        return params
    return params + expert_params * (dp_shards / edp - 1)


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
    shards = _dp_shards(layout)
    experts = costs.expert_params[rank] if costs.expert_params else 0.0
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp) if experts else 1
    if shards == 1 and edp == 1:
        return 0.0
    net, opts = model.network, model.options
    if _per_chunk_grad_sync(layout, opts.data.overlap_grad_reduce, experts > 0):
        return interleaved_dp_exposed(model, layout, costs, rank)
    params = costs.params[rank]
    root = fsdp_root_params(model, layout, rank) if layout.zero_stage == 3 else 0.0
    groups = [(params - experts, shards, layout.tp, root > 0)]  # FSDP's root unit: a dense unit of its own
    if experts:
        groups.append((experts, edp, layout.ep * layout.expert_tp, False))
    reduce = gather = 0.0
    calls = 0
    for group_params, group_shards, stride, with_root in groups:
        if group_shards == 1 or group_params <= 0:
            continue
        n = _dp_calls(layout, rank, group_params, opts.data.overlap_grad_reduce, group_shards) + with_root
        calls += n
        grad_bytes = group_params * opts.data.grad_reduce_bytes / n
        param_bytes = group_params * model.dtype_bytes / n
        if layout.zero_stage == 0 or (layout.zero_stage == 1 and opts.data.bf16_optimizer):
            reduce += n * net.all_reduce(grad_bytes, group_shards, stride)
        else:
            reduce += n * net.reduce_scatter(grad_bytes, group_shards, stride)
        if layout.zero_stage > 0:  # BF16_Optimizer: all-reduce, then its sharded step's all-gather
            gather += n * net.all_gather(param_bytes, group_shards, stride)
    if not calls:
        return 0.0
    bucket = edge = params / calls
    if rank == 0 and layout.zero_stage < 3:  # the last bucket holds at least the word embedding
        edge = min(params, max(bucket, memory.embedding_param_count(model.spec, layout.tp)))
    if root:  # FSDP's root unit: its all-gather opens the forward, its reduce-scatter closes the backward
        bucket, edge = (params - root) / max(1, calls - 1), root
    if layout.zero_stage == 3:  # FSDP frees the gathered weights after the forward and
        reduce += gather        # gathers them again for the backward (Rajbhandari et al. 2020: 3x)
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


def _earlier_microbatch_collectives(layout: Layout, reduce: float, gather: float, forward: float,
                                    backward: float, sm_share: float) -> float:
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
    per_microbatch = (overlapped_extra_time(gather, forward, sm_share)
                      + overlapped_extra_time(reduce, backward, sm_share))
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
    if not (opts.data.fsdp2 or opts.data.fsdp1_grad_cat) or layout.zero_stage != 3 or _dp_shards(layout) == 1:
        return 0.0
    m = layout.num_microbatches if layout.pp == 1 else 1
    calls = _layers_on(layout, rank) + (fsdp_root_params(model, layout, rank) > 0)
    if opts.data.fsdp1_grad_cat:
        return step_costs.fsdp1_grad_cat_time(model.analytic, params, model.dtype_bytes, reduces=m, calls=calls)
    return step_costs.fsdp2_copy_time(model.analytic, params, model.dtype_bytes, opts.data.grad_reduce_bytes,
                                      gathers=2 * m, reduces=m, calls=calls)


def _per_chunk_grad_sync(layout: Layout, overlap_grad_reduce: bool, has_experts: bool) -> bool:
    """Whether the rank's reduction is charged chunk by chunk: Megatron's interleaved 1F1B with
    overlapped reduction (ZeRO 0-2; FSDP is charged per layer). A rank holding routed experts
    reduces two groups (DP x CP and EDP), which `interleaved_dp_exposed` does not model: it is
    charged whole, as without interleaving."""
    return (layout.schedule == "interleaved_1f1b" and layout.vpp > 1 and overlap_grad_reduce
            and layout.zero_stage < 3 and not has_experts)


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
    shards, stride = _dp_shards(layout), layout.tp
    vpp, group = layout.vpp, min(layout.pp, layout.num_microbatches)
    backward = [i + w for i, w in zip(costs.backward_input_s[rank], costs.backward_weight_s[rank], strict=True)]
    forward = costs.forward_s[rank]
    reduce, gather = [], []
    for chunk, params in enumerate(costs.chunk_params[rank]):
        calls = max(1, grad_bucket_count(params, shards, rank if chunk == 0 else 1, True,
                                         every_rank=layout.zero_stage == 2))
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


def _dp_calls(layout: Layout, rank: int, params: float, overlap: bool, shards: int) -> int:
    """Collective calls of one DP reduction over `shards` ranks: FSDP reduces each layer on its own (and its root
    unit: `exposed_dp_time`); Megatron-LM's DDP one per bucket (`grad_bucket_count`,
    planner/cost/comm/buckets.py) on the first pipeline rank and, under ZeRO-2, on every rank;
    one bucket on the others and without overlap."""
    if layout.zero_stage == 3:
        return max(1, _layers_on(layout, rank))
    return max(1, grad_bucket_count(params, shards, rank, overlap, every_rank=layout.zero_stage == 2))


def optimizer_time(model: CostModel, zero_stage: int, dp_shards: int, params: float) -> float:
    """The Adam step over the parameters this GPU owns, as multi-tensor kernels, and the copy
    of the updated fp32 main parameters into the model's (planner/cost/step.py)."""
    return step_costs.adam_time(model.analytic, params, zero_stage, dp_shards, model.options.data.optimizer_kernels)


def layout_memory(model: CostModel, layout: Layout, costs: ChunkCosts,
                  peak_activation_bytes: tuple[float, ...]) -> tuple[RankMemory, ...]:
    """Memory of every pipeline rank, given the peak bytes of activations each holds."""
    experts = costs.expert_params or [0.0] * layout.pp
    state = memory.state_bytes_per_param(layout.zero_stage, _dp_shards(layout))
    edp = memory.expert_dp_shards(layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp)
    expert = memory.state_bytes_per_param(layout.zero_stage, edp)  # routed experts shard over EDP
    return tuple(_rank_memory(model, layout, costs, peak_activation_bytes[r], r, experts[r], state, expert)
                 for r in range(layout.pp))


def _rank_memory(model: CostModel, layout: Layout, costs: ChunkCosts, peak_activations: float,
                 rank: int, expert_params: float, state: memory.StateBytes,
                 expert: memory.StateBytes) -> RankMemory:
    """Memory of pipeline rank `rank`: `state` bytes per dense parameter, `expert` per routed
    expert parameter (`memory.state_bytes_per_param` over DP x CP and over EDP)."""
    params = costs.params[rank]
    activations = peak_activations + costs.extra_bytes[rank]
    if model.options.memory.parameter_copies > 1:  # the schedule's further copies of the rank's layers
        layer_params, layer_experts = _layer_params(model, layout, rank)
        params += (model.options.memory.parameter_copies - 1) * layer_params
        expert_params += (model.options.memory.parameter_copies - 1) * layer_experts
    dense = params - expert_params
    weights = dense * state.weights + expert_params * expert.weights
    if layout.zero_stage == 3:  # unsharded bf16 copies of the block being computed, the one
        root = fsdp_root_params(model, layout, rank)  # prefetched, and the root unit
        block = (costs.params[rank] - root) / max(1, _layers_on(layout, rank))
        weights += model.dtype_bytes * (2 * block + root)
    grads = dense * state.grads + expert_params * expert.grads
    if model.options.data.bf16_optimizer and layout.zero_stage <= 1:  # bf16 .grad beside the fp32 buffer
        grads += params * model.dtype_bytes
    optimizer = dense * state.optimizer + expert_params * expert.optimizer
    tensors = weights + grads + optimizer + activations
    outside = memory.outside_allocator_bytes(layout.tp, layout.cp, layout.dp, layout.pp,
                                             _in_embedding_group(model, layout, rank),
                                             model.options.memory.cuda_context_bytes)
    segments = costs.cached_segment_bytes[rank] if costs.cached_segment_bytes else 0.0
    return RankMemory(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        activations=activations,
        other=memory.other_bytes(tensors, outside) + segments,
        outside_allocator=outside,
    )


def _layer_params(model: CostModel, layout: Layout, rank: int) -> tuple[float, float]:
    """Parameters of the transformer layers on pipeline rank `rank` (one shard), and the routed
    experts' among them: what `CostOptions.memory.parameter_copies` repeats (the embedding, head and
    multi-token-prediction modules are not: DualPipe holds them once on each end rank)."""
    spec, etp = model.spec, layout.expert_tp
    per_kind = {"transformer": (memory.transformer_param_count(spec, layout.tp, layout.ep, etp),
                                memory.routed_expert_param_count(spec, layout.ep, etp) if spec.is_moe else 0.0),
                DENSE_BLOCK: (memory.transformer_param_count(spec, layout.tp, moe=False), 0.0)}
    params = experts = 0.0
    for start, end in layout.stage_layers[rank]:
        for kind, n in _kind_counts(model, start, end):
            params += n * per_kind[kind][0]
            experts += n * per_kind[kind][1]
    return params, experts


def fsdp_root_params(model: CostModel, layout: Layout, rank: int) -> float:
    """Parameters of `rank` that FSDP keeps unsharded from the first forward to the end of the
    backward, the step's memory peak included: those outside the wrapped transformer blocks (the
    embedding, the final norm and the head), which the root module's own unit holds. FSDP1 does
    not free the root's parameters after its forward ("Do not free the root's parameters in the
    post-forward for `FULL_SHARD` with the intention that they are immediately used for backward
    computation": _runtime_utils._post_forward_reshard), FSDP2 likewise ("For the root, do not
    reshard after forward since for training, the parameters would be freed and all-gathered
    immediately": FSDPState._lazy_init); both reshard it only after the backward."""
    spec, last = model.spec, head_rank(layout.schedule, layout.pp, layout.vpp)
    params = memory.embedding_param_count(spec, layout.tp) if rank == 0 else 0.0
    if rank == last:
        params += memory.head_param_count(spec, layout.tp, shares_rank_with_embedding=last == 0)
    return params


def _in_embedding_group(model: CostModel, layout: Layout, rank: int) -> bool:
    """Whether `rank` all-reduces the tied word embedding's grads with another pipeline rank."""
    last = head_rank(layout.schedule, layout.pp, layout.vpp)
    return model.spec.tie_embeddings and last != 0 and rank in (0, last)


def _layers_on(layout: Layout, rank: int) -> int:
    return sum(end - start for start, end in layout.stage_layers[rank])
