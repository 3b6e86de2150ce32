"""The cost model: per layer kind, at one shard, its compute time split into forward,
backward-input and backward-weight, its exposed tensor/context-parallel communication,
its recomputation overhead, the activations it saves and its parameters.

Compute times come from a `ComputeSource`: the analytic roofline (planner/cost/compute.py)
or a measured profile. Everything else is analytic. Results are cached per shape, since the
search asks for the same few shapes many times. The runtime behaviours priced, `CostOptions`,
are in planner/cost/options.py (re-exported here with their value types).
"""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import accumulate
from typing import Protocol

from planner.cost import memory
from planner.cost.comm import Network
from planner.cost.compute import AnalyticCompute, LayerTimes, fused_kernel_rates
from planner.cost.fp8_casts import GATHERED_FP8_BYTES, amax_reductions, block_casts, writes_transposes
from planner.cost.grad_accum import wgrad_output_bytes
from planner.cost.kernel_counts import host_times, megatron_moe_block, op_counts
from planner.cost.moe import deepep_sm_fraction, deepep_times, dispatch_bytes, imbalance_of
from planner.cost.options import CP_COMM, FIELD_GROUP, P2P_MODES, PRECISIONS, CostOptions, CpComm, P2pMode, Precision  # noqa: F401
from planner.cost.overlap import SplitLayer, combined_1f1b_extra_time, comm_sm_fraction, overlapped_extra_time
from planner.cost.shapes import Gemm, Shard, attention_gemms, layer_work, moe_gemms, separate_matmuls, transformer_gemms
from planner.cost.stragglers import straggler_slowdown
from planner.cost.tp_backward import Parallel, backward_collectives, backward_comm_seconds
from planner.spec import Cluster, GpuSpec, ModelSpec
from planner.units import DTYPE_BYTES

DUALPIPEV_PAIRING = "dualpipev"
"""`layer_costs`'s `paired` for DualPipeV: its whole-pass overlap of one micro-batch's all-to-all
with the other's compute, whether or not the run enables Megatron's combined 1F1B."""


def sp_copy_counts(kind: str, recompute: str, selective_policy: str, early_stop: bool) -> tuple[int, int, int]:
    """Sequence-dim copies (`CostOptions.tensor.sp_seq_dim_copies`) a layer runs in its forward, its
    backward and its recomputation, as torchtitan's compiled Llama block runs them (inductor's
    code for the block under torchtitan's TP plan, docs/accuracy_published.md section 14).
    A block: one after each of its two all-gathers and one before each of its two
    reduce-scatters in the forward; in the backward one after each all-gather of a
    reduce-scatter's gradient, while the copies before the reduce-scatters of the input
    gradients fuse into the kernel that sums the q/k/v (gate/up) data gradients; a recompute
    copies again after each all-gather it re-runs: both under the per-op policy (reduce-scatter
    outputs saved), and under full recompute the attention output's reduce-scatter too, and the
    MLP output's unless the checkpoint stops once the down projection's input is back
    (`early_stop`, CostOptions.recompute.recompute_early_stop). The embedding's output
    reduce-scatter and the head's input all-gather (eager, outside the compiled blocks): one
    each way."""
    if kind in ("embedding", "head"):
        return 1, 1, 0
    if kind != "transformer":
        return 0, 0, 0
    again = {"full": 3 if early_stop else 4, "selective": 2 if selective_policy == "every_other_matmul" else 0}.get(
        recompute, 0
    )
    return 4, 2, again


def analytic_compute(gpu: GpuSpec, options: CostOptions, num_gpus: int = 1) -> AnalyticCompute:
    """The analytic roofline for `options`: its dtype, fp8 GEMMs under FP8 precision, and the
    compute pace of the slowest of a job's `num_gpus` GPUs (`compute_slowdown`)."""
    kernels = options.kernels
    return AnalyticCompute(
        gpu,
        kernels.dtype,
        gemm_dtype="fp8" if kernels.precision == "fp8" else None,
        compute_slowdown=compute_slowdown(gpu, options, num_gpus),
        wgrad_output_bytes=wgrad_output_bytes(options.data.wgrad_accumulation, options.data.grad_reduce_bytes),
    )


def compute_slowdown(gpu: GpuSpec, options: CostOptions, num_gpus: int) -> float:
    """Expected compute slowdown of a job on `num_gpus` `gpu`s waiting for its slowest one
    (1.0 with stragglers off or no speed population for the GPU)."""
    if not options.cluster.stragglers:
        return 1.0
    return straggler_slowdown(options.cluster.speed_spread or gpu.speed_spread, num_gpus)


def options_for_gpu(options: CostOptions, gpu: GpuSpec) -> CostOptions:
    """`options` with an attention kernel `gpu` has rates for: FlashAttention-2 in place of a
    fused kernel it lacks (what the same runtime falls back to there)."""
    rates = fused_kernel_rates(gpu.efficiency).get(options.kernels.attention)
    if rates is not None and rates[0] is None:
        return options.with_fields(attention="flash2")
    return options


DENSE_BLOCK = "dense_transformer"
"""Layer kind of an MoE model's blocks with a dense MLP (DeepSeek's first_k_dense_replace
layers, Qwen's layers off the decoder_sparse_step): costed as the same block with the dense
MLP (`dense_variant`), analytically whatever source measures the MoE block."""


def block_kinds(spec: ModelSpec) -> tuple[str, ...]:
    """Per transformer layer, the kind its costs are asked for: "transformer" (the model's
    block; an MoE block in an MoE model) or `DENSE_BLOCK`."""
    if not spec.is_moe:
        return ("transformer",) * spec.num_layers
    return tuple("transformer" if spec.is_moe_layer(i) else DENSE_BLOCK for i in range(spec.num_layers))


def dense_variant(spec: ModelSpec) -> ModelSpec:
    """The model with every MLP dense (width ffn_hidden_size): the cost of its dense layers."""
    return spec.model_copy(
        update={
            "num_experts": 0,
            "moe_top_k": 0,
            "moe_ffn_hidden_size": None,
            "num_shared_experts": 0,
            "shared_expert_ffn_hidden_size": None,
            "first_dense_layers": 0,
            "moe_layer_freq": 1,
            "moe_capacity_factor": None,
            "mtp_depth": 0,
            "name": f"{spec.name} (dense layers)",
        }
    )


class ComputeSource(Protocol):
    """Where layer compute times come from."""

    name: str

    def layer_times(self, kind: str, shard: Shard) -> LayerTimes:
        """Forward / backward-input / backward-weight time of `kind` at `shard`."""
        ...


class AnalyticSource:
    """Layer times from FLOPs and bytes over the GPU's efficiency curves, never shorter than
    the host takes to launch the layer's kernels (unless CUDA graphs replay them)."""

    name = "analytic"

    def __init__(self, spec: ModelSpec, compute: AnalyticCompute, options: CostOptions = CostOptions()):
        self.spec, self.compute, self.options = spec, compute, options

    def at_pace(self, compute_slowdown: float) -> AnalyticSource:
        """This source with its compute-bound rates at `compute_slowdown` (a job's slowest GPU)."""
        if compute_slowdown == self.compute.compute_slowdown:
            return self
        compute = copy(self.compute)
        compute.compute_slowdown = compute_slowdown
        return AnalyticSource(self.spec, compute, self.options)

    def layer_times(self, kind: str, shard: Shard) -> LayerTimes:
        kernels, moe = self.options.kernels, self.options.moe
        work = layer_work(
            self.spec,
            kind,
            shard,
            attention=kernels.attention,
            dropout=kernels.dropout,
            imbalance=imbalance_of(self.spec, shard, moe.moe_imbalance),
            loss_passes=kernels.loss_passes,
            rope_fusion=kernels.rope_fusion,
        )
        if kernels.elementwise_traffic != 1.0:
            work = replace(
                work,
                elementwise_bytes_fwd=work.elementwise_bytes_fwd * kernels.elementwise_traffic,
                elementwise_bytes_bwd=work.elementwise_bytes_bwd * kernels.elementwise_traffic,
            )
        if kind == "transformer" and kernels.precision == "fp8":
            casts = block_casts(
                kernels.fp8_casts, self.spec, shard, writes_transposes(self.compute.gpu), kernels.fp8_recipe
            )
            work = replace(
                work,
                elementwise_bytes_fwd=work.elementwise_bytes_fwd + casts.bytes_fwd,
                elementwise_bytes_bwd=work.elementwise_bytes_bwd + casts.bytes_bwd,
                kernels_fwd=work.kernels_fwd + casts.kernels_fwd,
                kernels_bwd=work.backward_kernels + casts.kernels_bwd,
            )
        times = self.compute.layer_times(work, kernels.attention)
        if kernels.cuda_graphs:
            return times
        counts = op_counts(self.spec, kind, not kernels.flash_attention, kernels.dropout)
        if kind == "transformer" and self.spec.is_moe and moe.megatron_moe_ops and moe.moe_dispatcher == "deepep":
            counts = megatron_moe_block(counts, self.spec.num_experts // shard.ep)
        if kernels.launch_blocking:
            return host_serial(times, *host_times(counts, self.compute.eff))
        return host_floor(times, *host_times(counts, self.compute.eff))


def host_floor(times: LayerTimes, host_forward_s: float, host_backward_s: float) -> LayerTimes:
    """Layer times no shorter than the host's launch time: the host runs ahead of the GPU
    asynchronously, so a pass takes the longer of the two. A host-bound backward stretches
    its input and weight parts alike."""
    backward = times.backward_s
    stretch = host_backward_s / backward if backward > 0 and host_backward_s > backward else 1.0
    return LayerTimes(
        forward_s=max(times.forward_s, host_forward_s),
        backward_input_s=times.backward_input_s * stretch,
        backward_weight_s=times.backward_weight_s * stretch,
    )


def host_serial(times: LayerTimes, host_forward_s: float, host_backward_s: float) -> LayerTimes:
    """Layer times when each launch blocks until its kernel ends (CUDA_LAUNCH_BLOCKING=1):
    the host's time and the GPU's add up; the backward's host time is shared between its
    input and weight parts in proportion to their GPU time."""
    backward = times.backward_s
    stretch = (backward + host_backward_s) / backward if backward > 0 else 1.0
    return LayerTimes(
        forward_s=times.forward_s + host_forward_s,
        backward_input_s=times.backward_input_s * stretch,
        backward_weight_s=times.backward_weight_s * stretch,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCosts:
    """One layer of one kind, one micro-batch, one GPU (seconds, bytes, parameters)."""

    forward_s: float
    backward_input_s: float
    """Includes the recomputation the chosen recompute mode runs before the backward."""
    backward_weight_s: float
    comm_forward_s: float
    """Exposed TP/CP communication in the forward."""
    comm_backward_s: float
    recompute_s: float
    """Part of backward_input_s spent re-running the forward."""
    activation_bytes: float
    """Saved for backward under the recompute mode."""
    peak_extra_bytes: float
    """Transient memory above the saved activations while the layer runs its backward."""
    param_count: float
    moe_comm_s: float = 0.0
    """Exposed all-to-all (dispatch and combine, forward and backward): part of comm_*_s."""
    expert_param_count: float = 0.0
    """Part of param_count that are routed experts (their optimizer shards over EDP)."""
    split_backward_comm_s: float = 0.0
    """Exposed seconds the backward-input pass gains when the schedule runs the weight gradients
    as a pass of their own (zero-bubble W): the TP reductions that otherwise hide behind the
    weight-gradient GEMMs (`CostOptions.tensor.tp_backward_overlap` "async")."""

    @property
    def backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s


class CostModel:
    """Layer costs of one model on one cluster; `layer_costs` is cached."""

    def __init__(
        self,
        spec: ModelSpec,
        cluster: Cluster,
        options: CostOptions = CostOptions(),
        source: ComputeSource | None = None,
        network: Network | None = None,
    ):
        self.spec = spec
        self.cluster = cluster
        self.options = options
        self.network = network or Network.of(cluster)
        self.analytic = analytic_compute(cluster.gpu, options, cluster.num_gpus)
        if options.kernels.flash_attention:  # refuse a fused kernel this GPU has no rates for, up front
            self.analytic.attention_rates(options.kernels.attention)
        slowdown = self.analytic.compute_slowdown
        if source is None:
            source = AnalyticSource(spec, self.analytic, options)
        elif isinstance(source, AnalyticSource):  # another job's analytic source: at this job's pace
            source = source.at_pace(slowdown)
        self.source = source
        self.source_slowdown = 1.0 if isinstance(source, AnalyticSource) else slowdown
        """Factor on a measured source's layer times (a profile timed on one GPU): the job's
        slowest GPU; the analytic source applies it to its compute-bound rates itself."""
        kernels, recomputed = options.kernels, options.recompute
        self.act_options = memory.activation_options_for(
            options.memory.activation_storage,
            kernels.precision == "fp8",
            flash_attention=kernels.flash_attention,
            dropout=kernels.dropout,
            selective_policy=recomputed.selective_policy,
            eager_swiglu=kernels.eager_swiglu,
            sac_fused_qkv=recomputed.sac_fused_qkv,
            recompute_modules=frozenset(recomputed.recompute_modules),
        )
        self.moe_act_options = replace(self.act_options, moe_imbalance=options.moe.moe_imbalance)
        self.block_kinds = block_kinds(spec)
        self.dense_layers_before = tuple(accumulate((kind == DENSE_BLOCK for kind in self.block_kinds), initial=0))
        """[i]: dense-MLP blocks among layers [0, i)."""
        self.dense_block = (
            CostModel(dense_variant(spec), cluster, options, network=self.network)
            if DENSE_BLOCK in self.block_kinds
            else None
        )
        self.layer_costs = lru_cache(maxsize=None)(self._layer_costs)
        self.combined_1f1b_layer = lru_cache(maxsize=None)(self._combined_1f1b_layer)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.options.kernels.dtype]

    def _layer_costs(self, kind: str, shard: Shard, recompute: str = "none", paired: bool = False) -> LayerCosts:
        """`paired`: the schedule runs another micro-batch's compute beside this one's
        all-to-all, which hides it but for the slowdown it causes: True (Megatron's combined
        1F1B order under `moe_ep_overlap`, else DualPipeV's) or DUALPIPEV_PAIRING."""
        if kind == DENSE_BLOCK:
            if self.dense_block is None:
                raise ValueError(f"{self.spec.name} has no dense-MLP block beside its MoE blocks")
            return self.dense_block.layer_costs("transformer", replace(shard, ep=1, etp=None), recompute)
        if kind == "mtp":
            return self._mtp_costs(shard, recompute, paired)
        times = self._layer_times(kind, shard)
        comm_fwd, comm_bwd, deferred = self._tp_cp_comm(kind, shard)
        moe_fwd, moe_bwd = self._moe_comm(kind, shard, recompute, times, paired)
        comm_fwd, comm_bwd = comm_fwd + moe_fwd, comm_bwd + moe_bwd
        comm_bwd += self._recompute_comm(kind, shard, recompute, comm_fwd - moe_fwd)
        hidden = 1.0 - self.options.tensor.tp_comm_overlap
        # the overlapped TP communication slows the GEMMs it runs beside
        sm_share = comm_sm_fraction(self.cluster.gpu.efficiency, self.options.cluster.interference)
        overlapped = self.options.tensor.tp_comm_overlap * sm_share
        recompute_s = self._recompute_time(kind, shard, recompute, times)
        copy_fwd, copy_bwd, copy_recompute = self._sp_copy_times(kind, shard, recompute)
        times = replace(times, forward_s=times.forward_s + copy_fwd, backward_input_s=times.backward_input_s + copy_bwd)
        recompute_s += copy_recompute
        act_options = self._act_options(shard)
        saved = self._measured_activation_bytes(kind, shard, recompute)
        if saved is None:
            saved = memory.activation_bytes(self.spec, kind, shard, recompute, act_options)
        extra = 0.0
        if kind == "transformer" and recompute == "full":
            extra = memory.activation_bytes(self.spec, kind, shard, "none", act_options)
        elif kind == "head":  # the logits and the loss's buffers beside the saved fp32 softmax
            extra = memory.loss_transient_bytes(self.spec, shard, self.dtype_bytes, self.options.kernels.cross_entropy)
        experts = 0.0
        if kind == "transformer":
            params = memory.transformer_param_count(self.spec, shard.tp, shard.ep, shard.etp)
            if self.spec.is_moe:
                experts = memory.routed_expert_param_count(self.spec, shard.ep, shard.etp or shard.tp)
        else:
            params = {"embedding": memory.embedding_param_count, "head": memory.head_param_count}[kind](
                self.spec, shard.tp
            )
        # TP overlap hides TP/CP collectives, not the all-to-all (its own term above)
        return LayerCosts(
            forward_s=times.forward_s + overlapped * (comm_fwd - moe_fwd),
            backward_input_s=times.backward_input_s + recompute_s + overlapped * (comm_bwd - moe_bwd),
            backward_weight_s=times.backward_weight_s,
            comm_forward_s=(comm_fwd - moe_fwd) * hidden + moe_fwd,
            comm_backward_s=(comm_bwd - moe_bwd) * hidden + moe_bwd,
            recompute_s=recompute_s,
            activation_bytes=saved,
            peak_extra_bytes=extra,
            param_count=params,
            moe_comm_s=moe_fwd + moe_bwd,
            expert_param_count=experts,
            split_backward_comm_s=deferred * hidden,
        )

    def _mtp_costs(self, shard: Shard, recompute: str, paired: bool) -> LayerCosts:
        """The model's multi-token-prediction modules, all `mtp_depth` of them (DeepSeek-V3
        report, section 2.2; Megatron-Core's MultiTokenPredictionLayer, on the last pipeline
        stage): each looks up the shared embedding, projects the two normalised inputs (2h -> h,
        column-parallel over TP), runs one block of the model's predominant kind and the shared
        output head with its loss. The stage holds its own copy of the embedding table (Megatron
        builds the embedding on the MTP stage too); the head's weights are the model's own."""
        spec, depth = self.spec, self.spec.mtp_depth
        if not depth:
            raise ValueError(f"{spec.name} has no multi-token-prediction module")
        block = self.layer_costs("transformer", shard, recompute, paired)
        embedding, head = self.layer_costs("embedding", shard), self.layer_costs("head", shard)
        h = spec.hidden_size
        projection = Gemm("mtp_projection", shard.local_tokens, h // shard.tp, 2 * h)
        project_s = self.analytic.gemm_time(projection.m, projection.n, projection.k)
        norms = (2 if spec.norm == "layernorm" else 1) * h
        projection_params = 2 * h * h / shard.tp + 2 * norms
        projection_input = memory.BYTES_BF16 * shard.local_tokens * 2 * h
        parts = (block, embedding, head)
        return LayerCosts(
            forward_s=depth * (sum(p.forward_s for p in parts) + project_s),
            backward_input_s=depth * (sum(p.backward_input_s for p in parts) + project_s),
            backward_weight_s=depth * (sum(p.backward_weight_s for p in parts) + project_s),
            comm_forward_s=depth * sum(p.comm_forward_s for p in parts),
            comm_backward_s=depth * sum(p.comm_backward_s for p in parts),
            recompute_s=depth * block.recompute_s,
            activation_bytes=depth * (sum(p.activation_bytes for p in parts) + projection_input),
            peak_extra_bytes=max(block.peak_extra_bytes, head.peak_extra_bytes),
            param_count=depth * (block.param_count + projection_params) + embedding.param_count,
            moe_comm_s=depth * block.moe_comm_s,
            expert_param_count=depth * block.expert_param_count,
            split_backward_comm_s=depth * sum(p.split_backward_comm_s for p in parts),
        )

    def _act_options(self, shard: Shard) -> memory.ActivationOptions:
        if not self.spec.is_moe or shard.ep == 1:
            return self.act_options
        return replace(self.act_options, moe_imbalance=imbalance_of(self.spec, shard, self.options.moe.moe_imbalance))

    def _moe_comm(
        self, kind: str, shard: Shard, recompute: str, times: LayerTimes, paired: bool
    ) -> tuple[float, float]:
        """Forward and backward seconds of an MoE block's token all-to-all over its EP group
        (dispatch and combine each way; full recompute re-runs the forward's two) and, with
        ETP > 1, the all-gather and reduce-scatter of the routed tokens over the ETP group.
        Ranks fold as Megatron's "etp-ep-edp" order: ETP fastest, EP next. `paired`: hidden
        behind another micro-batch's compute (its backward for a forward, and back): in
        Megatron's combined-1F1B order when True and `moe_ep_overlap` is on, else (and always
        for DUALPIPEV_PAIRING) as DualPipeV's whole-pass overlap."""
        spec = self.spec
        if kind != "transformer" or not spec.is_moe:
            return 0.0, 0.0
        one_way = self._a2a_one_way(shard)
        fwd, bwd = 2 * one_way, 2 * one_way
        if recompute == "full":
            bwd += fwd
        if paired is True and self.options.moe.moe_ep_overlap:
            half = combined_1f1b_extra_time(self._split_layer(shard, times, one_way), self._a2a_sm_share(shard)) / 2
            return half, half
        if paired:
            sm_share = self._a2a_sm_share(shard)
            fwd, bwd = (
                overlapped_extra_time(fwd, times.backward_s, sm_share),
                overlapped_extra_time(bwd, times.forward_s, sm_share),
            )
        return fwd, bwd

    def _a2a_one_way(self, shard: Shard) -> float:
        """Seconds of one MoE all-to-all (a dispatch or a combine) on the busiest rank, with the
        ETP all-gather of the routed tokens where ETP > 1."""
        spec = self.spec
        etp = shard.etp or shard.tp
        imbalance = imbalance_of(spec, shard, self.options.moe.moe_imbalance)
        sent = dispatch_bytes(spec, shard, self.dtype_bytes) * imbalance
        if self.options.moe.moe_dispatcher == "deepep" and shard.ep > 1:
            fabric = self.network.fabric
            dispatch, combine = deepep_times(
                spec,
                shard,
                self.dtype_bytes,
                imbalance,
                self.network.gpus_per_node,
                fabric.nvlink_busbw,
                fabric.nic_busbw,
            )
            one_way = (dispatch + combine) / 2 + fabric.launch_us * 1e-6
        else:
            one_way = self.network.all_to_all(sent, shard.ep, etp)
        if etp > 1:
            one_way += self.network.all_gather(sent * etp, etp, 1)
        return one_way

    def _combined_1f1b_layer(self, shard: Shard) -> SplitLayer:
        """An MoE block at `shard` split into the nodes Megatron's combined 1F1B schedules apart
        (planner/cost/overlap.py), its compute as `layer_costs` times it (`combined_1f1b_layer`,
        cached per shard)."""
        return self._split_layer(shard, self._layer_times("transformer", shard), self._a2a_one_way(shard))

    def _layer_times(self, kind: str, shard: Shard) -> LayerTimes:
        """The cost source's compute times of one `kind` layer at `shard`, slowed by the
        stragglers where the source is measured (the analytic source applies them itself)."""
        times = self.source.layer_times(kind, shard)
        return times.scaled(self.source_slowdown) if self.source_slowdown != 1.0 else times

    def _a2a_sm_share(self, shard: Shard) -> float:
        """Share of the SMs the MoE all-to-all holds beside the compute it overlaps: DeepEP's
        fixed SM count (planner/cost/moe.py `DEEPEP_NUM_SMS`) where its kernels run and the GPU
        gives its SM count, else NCCL's channels (`comm_sm_fraction`); 0 without interference."""
        nccl = comm_sm_fraction(self.cluster.gpu.efficiency, self.options.cluster.interference)
        if not (self.options.cluster.interference and self.options.moe.moe_dispatcher == "deepep" and shard.ep > 1):
            return nccl
        deepep = deepep_sm_fraction(self.cluster.gpu.sm_count)
        return nccl if deepep is None else deepep

    def _split_layer(self, shard: Shard, times: LayerTimes, one_way: float) -> SplitLayer:
        """The block's compute split as Megatron's combined 1F1B schedules it: the routed and
        shared experts' GEMMs on the busiest rank (analytic, at most the block's own times) as
        the MLP node, the rest (attention, norms, router, elementwise) as pre-dispatch; each
        all-to-all (dispatch or combine) `one_way` seconds."""
        imbalance = imbalance_of(self.spec, shard, self.options.moe.moe_imbalance)
        experts = self.analytic.gemms_times(g for g in moe_gemms(self.spec, shard, imbalance) if g.name != "router")
        mlp = min(times.forward_s, experts.forward_s)
        mlp_dgrad = min(times.backward_input_s, experts.backward_input_s)
        mlp_wgrad = min(times.backward_weight_s, experts.backward_weight_s)
        return SplitLayer(
            pre=times.forward_s - mlp,
            mlp=mlp,
            pre_dgrad=times.backward_input_s - mlp_dgrad,
            pre_wgrad=times.backward_weight_s - mlp_wgrad,
            mlp_dgrad=mlp_dgrad,
            mlp_wgrad=mlp_wgrad,
            dispatch=one_way,
            combine=one_way,
        )

    def _measured_activation_bytes(self, kind: str, shard: Shard, recompute: str) -> float | None:
        """Saved bytes from a measured profile of the same dtype, where it has them (the
        profiler's `selective` is the core-attention policy)."""
        measured = getattr(self.source, "activation_bytes", None)
        profile = getattr(self.source, "profile", None)
        if measured is None or profile is None or profile.dtype != self.options.kernels.dtype:
            return None
        if recompute == "selective" and self.options.recompute.selective_policy != "core_attention":
            return None
        return measured(kind, shard, recompute)

    def _recompute_time(self, kind: str, shard: Shard, recompute: str, times: LayerTimes) -> float:
        """Full recompute re-runs the block's forward (less its last matmul under
        `recompute_early_stop`); selective re-runs the modules of
        `recompute_modules` (the attention core by default) or, under the every-other-matmul
        policy, the 2nd, 4th... matmul and the elementwise ops."""
        if kind != "transformer" or recompute == "none":
            return 0.0
        if recompute == "full":
            return times.forward_s - self._early_stop_gemm_time(shard)
        kernels, recomputed = self.options.kernels, self.options.recompute
        work = layer_work(
            self.spec,
            "transformer",
            shard,
            attention=kernels.attention,
            dropout=kernels.dropout,
            rope_fusion=kernels.rope_fusion,
        )
        if recomputed.selective_policy == "every_other_matmul":
            matmuls = separate_matmuls(self.spec, shard, fused_qkv=recomputed.sac_fused_qkv)[1::2]
            elementwise = work.elementwise_bytes_fwd * kernels.elementwise_traffic
            return sum(
                g.count * self.analytic.gemm_time(g.m, g.n, g.k) for g in matmuls
            ) + self.analytic.elementwise_time(elementwise, work.kernels_fwd)
        modules = recomputed.recompute_modules
        seconds = self.analytic.attention_core_times(work, kernels.attention)[0] if "core_attn" in modules else 0.0
        return seconds + self._module_recompute_time(shard, modules)

    def _stops_early(self) -> bool:
        """Whether full recompute stops before the block's down projection
        (`recompute_early_stop`, dense blocks only)."""
        return self.options.recompute.recompute_early_stop and not self.spec.is_moe

    def _early_stop_gemm_time(self, shard: Shard) -> float:
        """Seconds of the forward's last matmul, the MLP down projection, that full recompute
        skips under `recompute_early_stop` in a dense block (0 otherwise)."""
        if not self._stops_early():
            return 0.0
        down = transformer_gemms(self.spec, shard)[-1]
        return down.count * self.analytic.gemm_time(down.m, down.n, down.k)

    def _module_recompute_time(self, shard: Shard, modules: tuple[str, ...]) -> float:
        """Seconds the output-discarding recompute modules re-run before the backward: the two
        norms (read and write the hidden state), MLA's q and kv up-projection GEMMs, the routed
        experts' SwiGLU (read gate and up, write the product) on the busiest rank."""
        spec, analytic, seconds = self.spec, self.analytic, 0.0
        traffic = self.options.kernels.elementwise_traffic
        if "layernorm" in modules:
            seconds += analytic.elementwise_time(
                2 * 2 * memory.BYTES_BF16 * shard.elementwise_tokens * spec.hidden_size * traffic, 2
            )
        if "mla_up_proj" in modules and spec.is_mla:
            ups = [g for g in attention_gemms(spec, shard) if g.name in ("q", "q_up", "kv_up")]
            seconds += sum(g.count * analytic.gemm_time(g.m, g.n, g.k) for g in ups)
        if "moe_act" in modules and spec.is_moe and spec.activation == "swiglu":
            routed = (
                shard.local_tokens
                * spec.moe_top_k
                * imbalance_of(spec, shard, self.options.moe.moe_imbalance)
                * spec.expert_ffn_hidden_size
                / shard.tp
            )
            seconds += analytic.elementwise_time(3 * memory.BYTES_BF16 * routed * traffic, 1)
        return seconds

    def _sp_copy_times(self, kind: str, shard: Shard, recompute: str) -> tuple[float, float, float]:
        """Seconds of DTensor's sequence-dim copies around the layer's TP collectives
        (`sp_seq_dim_copies`) in its forward, its backward and its recomputation: each reads and
        writes the gathered activation once."""
        if not (self.options.tensor.sp_seq_dim_copies and shard.tp > 1 and shard.sequence_parallel):
            return 0.0, 0.0, 0.0
        act = self.dtype_bytes * shard.local_tokens * self.spec.hidden_size
        one = self.analytic.elementwise_time(2 * act, 1)
        fwd, bwd, again = sp_copy_counts(
            kind, recompute, self.options.recompute.selective_policy, self.options.recompute.recompute_early_stop
        )
        return fwd * one, bwd * one, again * one

    def _recompute_comm(self, kind: str, shard: Shard, recompute: str, forward_comm: float) -> float:
        """TP collectives the recomputation re-runs. Full recompute re-runs the block's forward
        with its collectives (`forward_comm`), but for the output collective of a dense block
        under `recompute_early_stop`. torchtitan's per-op policy keeps reduce-scatter
        outputs but not all-gathers or all-reduces, and its recompute runs up to the MLP's down
        projection: the two sequence-parallel all-gathers (attention and MLP inputs), or
        without sequence parallelism the attention output's all-reduce."""
        if kind != "transformer" or shard.tp == 1 or recompute == "none":
            return 0.0
        net, tp = self.network, shard.tp
        act = self.dtype_bytes * shard.local_tokens * self.spec.hidden_size
        if recompute == "full":
            if not self._stops_early():
                return forward_comm
            # the down projection's output collective is not re-run
            output = net.reduce_scatter(act, tp, 1) if shard.sequence_parallel else net.all_reduce(act, tp, 1)
            return forward_comm - output
        if self.options.recompute.selective_policy != "every_other_matmul":
            return 0.0
        if shard.sequence_parallel:
            return 2 * net.all_gather(self._gathered_bytes(kind, shard), tp, 1)
        return net.all_reduce(act, tp, 1)

    def _gathered_bytes(self, kind: str, shard: Shard) -> float:
        """Bytes of one sequence-parallel all-gather of the layer's activations (or their
        gradients): the fp8 copies a block's Transformer Engine linears gather under FP8
        (planner/cost/fp8_casts.py; dense blocks of standard attention, where it prices them), else
        the training dtype's."""
        dense = kind == "transformer" and not (self.spec.is_moe or self.spec.is_mla)
        element = GATHERED_FP8_BYTES if dense and self.options.kernels.te_fp8 else self.dtype_bytes
        return element * shard.local_tokens * self.spec.hidden_size

    def _tp_cp_comm(self, kind: str, shard: Shard) -> tuple[float, float, float]:
        """Forward and backward communication of the layer inside its TP and CP groups, and
        what the backward's gains when the weight gradients run as a pass of their own:
        a block all-reduces its output twice per pass (attention and MLP; all-gather plus
        reduce-scatter under sequence parallelism, same volume); the vocab-parallel
        embedding reduces its output; the head gathers its input and reduces the loss
        statistics. The backward's TP collectives as `tp_backward_overlap` runs them
        (`_async_tp_backward`). Ring attention passes K and V around the CP ring (dK, dV back
        too), hidden behind the attention core where it is shorter."""
        net, tp = self.network, shard.tp
        act = self.dtype_bytes * shard.local_tokens * self.spec.hidden_size
        if tp > 1 and shard.sequence_parallel:
            gathered = self._gathered_bytes(kind, shard)
            collective = net.all_gather(gathered, tp, 1) + net.reduce_scatter(act, tp, 1)
            one_way = net.all_gather(gathered, tp, 1)
        else:
            collective = net.all_reduce(act, tp, 1)
            one_way = collective
        asynchronous = tp > 1 and self.options.tensor.tp_backward_overlap != "none"
        if kind == "embedding":
            return (one_way, one_way if shard.sequence_parallel else 0.0, 0.0) if tp > 1 else (0, 0, 0)
        if kind == "head":
            if tp == 1:
                return 0, 0, 0
            stats = net.all_reduce(3 * 4 * shard.local_tokens, tp, 1)
            fwd = stats + (one_way if shard.sequence_parallel else 0.0)
            return (fwd, *self._async_tp_backward(kind, shard)) if asynchronous else (fwd, one_way, 0.0)
        fwd = bwd = 2 * collective if tp > 1 else 0.0
        deferred = 0.0
        if asynchronous:
            bwd, deferred = self._async_tp_backward(kind, shard)
        amaxes = (
            amax_reductions(self.spec, shard, self.options.kernels.fp8_recipe) if self.options.kernels.te_fp8 else 0
        )
        if amaxes:  # tensorwise scaling's amaxes: one 4-byte all-reduce each way per linear pair
            amax_s = amaxes * net.all_reduce(4, tp, 1)
            fwd, bwd = fwd + amax_s, bwd + amax_s
        if shard.cp > 1:
            all_gather = self.options.tensor.cp_comm == "all_gather"
            cp_comm = self._gathered_kv_comm if all_gather else self._ring_attention_comm
            fwd_cp, bwd_cp = cp_comm(shard)
            fwd, bwd = fwd + fwd_cp, bwd + bwd_cp
        return fwd, bwd, deferred

    def _async_tp_backward(self, kind: str, shard: Shard) -> tuple[float, float]:
        """Seconds the backward's TP collectives add to it under Megatron-LM's / Transformer
        Engine's asynchronous column-parallel backward (planner/cost/tp_backward.py), with the
        weight-gradient GEMMs in the same pass (under "async_delayed_wgrad" without them), and the
        more it takes when a split-backward schedule defers them.
        The overlapped collectives hide behind the linear's analytic GEMM times. Column- and
        row-parallel linears: the head's output layer; a block's fused QKV and output
        projection, and its MLP's up and down projections. Latent attention (its replicated
        down-projections) and an MoE block's MLP (tokens gathered and scattered by the
        dispatcher's own autograd functions) keep their synchronous collectives."""
        spec, net, tp = self.spec, self.network, shard.tp
        act = self.dtype_bytes * shard.local_tokens * spec.hidden_size
        sp = shard.sequence_parallel
        if kind == "head":
            gemms = layer_work(spec, "head", shard).gemms
            collectives = backward_collectives((("lm_head", "column"),), sp, True)
        else:
            gemms = attention_gemms(spec, shard)
            attention: tuple[tuple[str, Parallel], ...] = (("qkv", "column"), ("attn_out", "row"))
            mlp: tuple[tuple[str, Parallel], ...] = (("mlp_up", "column"), ("mlp_down", "row"))
            collectives = backward_collectives(mlp, sp, not spec.is_moe) + backward_collectives(
                attention, sp, not spec.is_mla
            )
            if not spec.is_moe:
                gemms = transformer_gemms(spec, shard, moe=False)
        gemm_s = {}
        for g in gemms:
            times = self.analytic.gemms_times((g,))
            gemm_s[g.name] = (times.backward_input_s, times.backward_weight_s)
        comm_s = {
            "all_gather": net.all_gather(self._gathered_bytes(kind, shard), tp, 1),
            "reduce_scatter": net.reduce_scatter(act, tp, 1),
            "all_reduce": net.all_reduce(act, tp, 1),
        }
        sm_share = comm_sm_fraction(self.cluster.gpu.efficiency, self.options.cluster.interference)
        together = backward_comm_seconds(collectives, comm_s, gemm_s, sm_share)
        deferred = backward_comm_seconds(collectives, comm_s, gemm_s, sm_share, wgrad_deferred=True)
        if self.options.tensor.tp_backward_overlap == "async_delayed_wgrad":
            return deferred, 0.0
        return together, deferred - together

    def _kv_bytes(self, shard: Shard) -> float:
        """K and V of one GPU's tokens (its CP and TP shard)."""
        kv_heads = max(self.spec.num_kv_heads / shard.tp, 1)
        return 2 * self.dtype_bytes * shard.local_tokens * kv_heads * self.spec.kv_channels

    def _gathered_kv_comm(self, shard: Shard) -> tuple[float, float]:
        """All-gather CP (Llama 3): K and V gathered over the CP group before attention, their
        gradients reduce-scattered after it, neither overlapped."""
        gathered = self._kv_bytes(shard) * shard.cp
        return (
            self.network.all_gather(gathered, shard.cp, shard.tp),
            self.network.all_gather(gathered, shard.cp, shard.tp),
        )

    def _ring_attention_comm(self, shard: Shard) -> tuple[float, float]:
        spec, net = self.spec, self.network
        kv_bytes = self._kv_bytes(shard)
        steps = shard.cp - 1
        hop = net.p2p(kv_bytes, shard.cp, shard.tp)
        kernels = self.options.kernels
        work = layer_work(spec, "transformer", shard, attention=kernels.attention, dropout=kernels.dropout)
        attn_fwd, attn_bwd = self.analytic.attention_core_times(work, kernels.attention)
        per_step_fwd, per_step_bwd = attn_fwd / shard.cp, attn_bwd / shard.cp
        sm_share = comm_sm_fraction(self.cluster.gpu.efficiency, self.options.cluster.interference)
        fwd = steps * overlapped_extra_time(hop, per_step_fwd, sm_share)
        bwd = steps * overlapped_extra_time(2 * hop, per_step_bwd, sm_share)
        return fwd, bwd
