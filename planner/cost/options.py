"""The runtime behaviours the costs depend on (`CostOptions`), in groups by what they touch:
kernels, tensor / data / pipeline parallelism, recomputation, memory, mixture of experts and
the cluster. Defaults are Megatron-LM's recommended settings. Each field's name is unique
across the groups, so a flat name (`CostOptions.of`, `with_fields`, `flat`, `FIELD_GROUP`)
says which group holds it. Where each behaviour comes from: docs/cost_options.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

from planner.cost import memory
from planner.cost.compute import ATTENTION_IMPLS, AttentionImpl
from planner.cost.fp8_casts import FP8_CASTS, FP8_RECIPES, Fp8Casts, Fp8Recipe
from planner.cost.grad_accum import WGRAD_ACCUMULATION, WgradAccumulation
from planner.cost.moe import DEFAULT_IMBALANCE, MOE_DISPATCHERS, MoeDispatcher
from planner.cost.shapes import LOSS_PASSES, LossPasses
from planner.cost.step import OPTIMIZER_KERNELS, OptimizerKernels
from planner.cost.tp_backward import TP_BACKWARD, TpBackward

CpComm = Literal["ring", "all_gather"]
CP_COMM: tuple[str, ...] = get_args(CpComm)
Precision = Literal["bf16", "fp8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
P2pMode = Literal["overlapped", "blocking", "deepspeed", "deepspeed-whole-grads", "megatron-lm"]
P2P_MODES: tuple[str, ...] = get_args(P2pMode)
Zero1Exchange = Literal["reduce_scatter", "all_reduce_broadcast", "all_reduce_all_gather"]
ZERO1_EXCHANGES: tuple[str, ...] = get_args(Zero1Exchange)


def _check_choices(group: Any, **allowed: tuple[str, ...]) -> None:
    """Refuse a field of `group` whose value is not among those `allowed` for it."""
    for name, choices in allowed.items():
        if getattr(group, name) not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {getattr(group, name)!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelOptions:
    """The kernels a layer runs: dtypes, attention, the loss and the memory-bound ops."""

    dtype: str = "bf16"
    """Training dtype of activations, weights and GEMM inputs: "bf16", "fp16", "fp32"."""
    precision: Precision = "bf16"
    """GEMM precision of the linear layers: "bf16", or "fp8" at the GPU's fp8 peak."""
    fp8_casts: Fp8Casts = "transformer_engine"
    """Under fp8, the kernels that quantize the linears' operands: "transformer_engine",
    "torchao" (tensorwise float8 under torch.compile) or "none" (not priced):
    planner/cost/fp8_casts.py."""
    fp8_recipe: Fp8Recipe = "delayed"
    """Transformer Engine's FP8 scaling, by Megatron-LM's `--fp8-recipe` names: "delayed" (its
    default) or "tensorwise" (per-tensor current scaling: an amax pass before each cast)."""
    attention: AttentionImpl = "flash2"
    """The attention core's kernel: "flash1", "flash2", "flash3", "cudnn", "triton_fa1" or "unfused"."""
    dropout: bool = False
    """Dropout runs (its kernels launched, its masks saved for the backward)."""
    cuda_graphs: bool = False
    """The runtime replays captured CUDA graphs: no host launch time per kernel."""
    launch_blocking: bool = False
    """CUDA_LAUNCH_BLOCKING=1: the host's per-op time adds to the GPU time."""
    elementwise_traffic: float = 1.0
    """HBM bytes of the memory-bound ops relative to fused kernels (1: fused; ~3.3 eager)."""
    eager_swiglu: bool = False
    """SwiGLU runs op by op and keeps silu's output too (torchtitan eager)."""
    rope_fusion: bool = True
    """RoPE as one fused kernel each way (True) or op by op (False)."""
    loss_passes: LossPasses = "fused"
    """The loss's passes over the logits: "fused" or "vocab_parallel_fp32" (op by op)."""
    cross_entropy: memory.CrossEntropy = "fused"
    """The loss's buffers over the logits: "fused" (vocab-parallel) or "eager_fp32"."""

    @property
    def te_fp8(self) -> bool:
        """FP8 linears quantized by Transformer Engine's kernels, whose cost is priced."""
        return self.precision == "fp8" and self.fp8_casts == "transformer_engine"

    @property
    def flash_attention(self) -> bool:
        """A fused attention kernel (anything but "unfused")."""
        return self.attention != "unfused"

    def __post_init__(self) -> None:
        _check_choices(
            self,
            attention=ATTENTION_IMPLS,
            precision=PRECISIONS,
            fp8_casts=FP8_CASTS,
            fp8_recipe=FP8_RECIPES,
            loss_passes=LOSS_PASSES,
            cross_entropy=memory.CROSS_ENTROPY,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallelOptions:
    """How tensor-, sequence- and context-parallel communication runs."""

    tp_comm_overlap: float = 0.0
    """Share of TP communication hidden behind GEMMs, of what the backward leaves exposed (0: none)."""
    tp_backward_overlap: TpBackward = "async"
    """The backward's TP collectives beside the linears' GEMMs: "async", "async_delayed_wgrad", "none"."""
    sp_seq_dim_copies: bool = False
    """Sequence parallelism copies each gathered or scattered activation (torch DTensor's seq-dim split)."""
    cp_comm: CpComm = "ring"
    """How context parallelism moves K and V: "ring" (hidden) or "all_gather" (exposed)."""

    def __post_init__(self) -> None:
        _check_choices(self, tp_backward_overlap=TP_BACKWARD, cp_comm=CP_COMM)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallelOptions:
    """The data-parallel gradient reduction, ZeRO-3's runtime and the optimizer step."""

    overlap_grad_reduce: bool = True
    """The gradient reduction overlaps the last micro-batch's backward."""
    overlap_param_gather: bool = True
    """The distributed optimizer's parameter all-gather overlaps the first forward."""
    grad_reduce_bytes: int = 4
    """Bytes per gradient element in the reduction (4: fp32)."""
    grad_bucket_params: int = 0
    """Parameters per gradient-reduction bucket (0: Megatron-LM's default, max(40M, 1M x DP))."""
    zero1_exchange: Zero1Exchange = "reduce_scatter"
    """How a ZeRO-1 optimizer shares gradients and updated parameters: "reduce_scatter" (gradient
    reduce-scatter, parameter all-gather), "all_reduce_broadcast" (gradient all-reduce, then one
    broadcast per data-parallel rank of the shard it updated) or "all_reduce_all_gather" (after
    the backward, one all-reduce of the whole gradient buffer; after the step, one all-gather of
    the updated shards; neither overlapped)."""
    fsdp2: bool = False
    """ZeRO-3 runs as FSDP2, copying gathered parameters and gradients on the compute stream."""
    fsdp1_grad_cat: bool = False
    """ZeRO-3 runs as FSDP1, concatenating every unit's gradients each micro-batch."""
    main_grad_cast: bool = False
    """Each 16-bit gradient is cast into a new fp32 main gradient before the step."""
    ddp_grad_copy_passes: int = 0
    """Read-and-write passes over every gradient around the all-reduce (0: reduced in place)."""
    wgrad_accumulation: WgradAccumulation = "fused"
    """How weight gradients accumulate over micro-batches: "fused", "autograd" or "none"."""
    bf16_optimizer: bool = False
    """DeepSpeed's BF16_Optimizer: bf16 .grad beside an fp32 accumulation buffer."""
    optimizer_kernels: OptimizerKernels = "fused"
    """The Adam step and gradient clipping: "fused" multi-tensor kernels or "foreach" ops."""

    def __post_init__(self) -> None:
        if self.ddp_grad_copy_passes < 0:
            raise ValueError(f"ddp_grad_copy_passes counts passes, >= 0; got {self.ddp_grad_copy_passes}")
        if self.grad_bucket_params < 0:
            raise ValueError(f"grad_bucket_params counts parameters, >= 0; got {self.grad_bucket_params}")
        if self.fsdp2 and self.fsdp1_grad_cat:
            raise ValueError("fsdp2 and fsdp1_grad_cat name two ZeRO-3 runtimes: set at most one")
        _check_choices(
            self,
            optimizer_kernels=OPTIMIZER_KERNELS,
            wgrad_accumulation=WGRAD_ACCUMULATION,
            zero1_exchange=ZERO1_EXCHANGES,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineOptions:
    """How the pipeline's stages exchange activations and gradients."""

    p2p_mode: P2pMode = "overlapped"
    """Sends and receives: "overlapped", "blocking", "deepspeed", "deepspeed-whole-grads", "megatron-lm"."""

    def __post_init__(self) -> None:
        _check_choices(self, p2p_mode=P2P_MODES)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeOptions:
    """What the `selective` and `full` recompute modes re-run."""

    selective_policy: memory.SelectivePolicy = "core_attention"
    """Selective recompute's policy: "core_attention" (Megatron-LM) or "every_other_matmul" (torchtitan)."""
    sac_fused_qkv: bool = True
    """torchtitan's per-op policy counts the q, k, v projections as one matmul (True) or three."""
    recompute_early_stop: bool = False
    """Full recompute stops once every tensor the backward needs is back (torch's checkpoint)."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """Modules the core-attention policy re-runs, among memory.RECOMPUTE_MODULES."""

    def __post_init__(self) -> None:
        _check_choices(self, selective_policy=memory.SELECTIVE_POLICIES)
        unknown = set(self.recompute_modules) - set(memory.RECOMPUTE_MODULES)
        if unknown:
            raise ValueError(f"recompute_modules must be among {memory.RECOMPUTE_MODULES}, got {sorted(unknown)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOptions:
    """Device memory beyond what the layers' shapes give."""

    activation_storage: memory.ActivationStorage = "default"
    """How saved activations are stored: "default" (bf16) or "deepseek_fp8"."""
    parameter_copies: int = 1
    """Copies of each pipeline rank's layers the schedule keeps (2: DualPipe), memory only."""
    cuda_context_bytes: float = memory.CUDA_CONTEXT_BYTES
    """The CUDA context and its kernel images, outside the caching allocator (bytes)."""

    def __post_init__(self) -> None:
        if self.cuda_context_bytes < 0:
            raise ValueError(f"cuda_context_bytes must be >= 0, got {self.cuda_context_bytes}")
        if self.parameter_copies < 1:
            raise ValueError(f"parameter_copies must be >= 1, got {self.parameter_copies}")
        _check_choices(self, activation_storage=memory.ACTIVATION_STORAGE)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeOptions:
    """How a mixture-of-experts block routes and moves its tokens."""

    moe_imbalance: float = DEFAULT_IMBALANCE
    """Busiest expert-parallel rank's tokens over the mean under dropless routing (>= 1)."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """How tokens reach their experts: "alltoall" (NCCL) or "deepep" (DeepEP's kernels)."""
    megatron_moe_ops: bool = False
    """An MoE block's host floor counts the ops Megatron-core's MoELayer launches on DeepEP."""
    moe_ep_overlap: bool = False
    """Megatron's combined-1F1B overlap of the all-to-all with another micro-batch's compute."""

    def __post_init__(self) -> None:
        if self.moe_imbalance < 1:
            raise ValueError(f"moe_imbalance is the busiest rank over the mean, >= 1; got {self.moe_imbalance}")
        _check_choices(self, moe_dispatcher=MOE_DISPATCHERS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterOptions:
    """How the job's GPUs slow one another."""

    interference: bool = True
    """Communication overlapping compute slows it by the share of SMs its kernels hold."""
    stragglers: bool = True
    """Compute-bound kernels run at the pace of the job's expected slowest GPU."""
    speed_spread: str | None = None
    """The per-GPU speed population: a preset name or file; None: the GPU preset's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostOptions:
    """Runtime behaviours the costs depend on (Megatron-LM's recommended defaults), by group."""

    kernels: KernelOptions = KernelOptions()
    tensor: TensorParallelOptions = TensorParallelOptions()
    data: DataParallelOptions = DataParallelOptions()
    pipeline: PipelineOptions = PipelineOptions()
    recompute: RecomputeOptions = RecomputeOptions()
    memory: MemoryOptions = MemoryOptions()
    moe: MoeOptions = MoeOptions()
    cluster: ClusterOptions = ClusterOptions()

    @classmethod
    def of(cls, **fields: Any) -> CostOptions:
        """Options from field names as `planner runtimes` and `--set` spell them (flat)."""
        return cls().with_fields(**fields)

    def with_fields(self, **fields: Any) -> CostOptions:
        """These options with the named fields (flat names) replaced."""
        changes: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            if name not in FIELD_GROUP:
                raise ValueError(f"no cost option named {name!r}")
            changes.setdefault(FIELD_GROUP[name], {})[name] = value
        return replace(self, **{group: replace(getattr(self, group), **values) for group, values in changes.items()})

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name."""
        return {name: getattr(getattr(self, group), name) for name, group in FIELD_GROUP.items()}


FIELD_GROUP: dict[str, str] = {
    field.name: group.name for group in fields(CostOptions) for field in fields(getattr(CostOptions(), group.name))
}
"""Each field's flat name -> the CostOptions attribute of the group that holds it."""
