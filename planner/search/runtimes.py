"""Keeping the search to what one training runtime can run (`planner plan --runtime`).

Two layers: `restrict` narrows the space up front with each runtime's fixed rules (its
schedules, one recompute setting for every stage, its parallel dimensions), which keeps
the search fast; `runtime_check` then asks the runtime's exporter itself about every plan
that would enter the answer, so a plan `plan --runtime R` returns is one `export --to R`
writes. The rules must agree with the exporters (tests/cli/test_plan.py checks it).
`with_runtimes` records, for each plan shown, every runtime whose exporter takes it.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost.model import CostOptions
from planner.errors import PlannerError
from planner.export import EXPORTERS, refusal, runs_on
from planner.export.common import replan_for
from planner.layout import Layout, entry_from_layout
from planner.predict import priced_options
from planner.plan import SIMULATED_ONLY_SCHEDULES, ClusterSummary, PlanEntry, PlanFile
from planner.search.space import SearchSpace
from planner.spec import Cluster, GpuSpec, ModelSpec

RUNTIME_RULES: dict[str, dict] = {
    "megatron": {"schedules": ("1f1b", "interleaved_1f1b"), "per_rank_recompute": False},
    "torchtitan": {"per_rank_recompute": False},
    "torch": {"cp": (1,)},
    "deepspeed": {"schedules": ("1f1b",), "per_rank_recompute": False, "tp": (1,), "cp": (1,),
                  "recompute": ("none", "full"), "zero": (0, 1)},
}
"""What each runtime fixes, as SearchSpace fields (intersected with the user's choices)."""

RUNTIME_COSTS: dict[str, dict] = {
    "megatron": {"p2p_mode": "megatron-lm", "megatron_moe_ops": True},
    "torchtitan": {"selective_policy": "every_other_matmul", "eager_swiglu": True, "fsdp2": True,
                   "tp_backward_overlap": "none", "sp_seq_dim_copies": True, "wgrad_accumulation": "none"},
    "torch": {"tp_backward_overlap": "none", "recompute_early_stop": True, "wgrad_accumulation": "none"},
    "deepspeed": {"p2p_mode": "deepspeed", "wgrad_accumulation": "none"},
}
"""How each runtime runs what the plan names, as CostOptions fields: torchtitan's `SelectiveAC`
(what the torchtitan exporter writes for `selective`) recomputes every other matmul, its
stock recipes run the model eager, so SwiGLU keeps silu's output (measured on its block by
tests/profile/test_blocks.py), and it shards data-parallel weights with FSDP2's fully_shard,
whose copy kernels run on the compute stream (planner/cost/step.py `fsdp2_copy_time`).
Megatron-LM blocks on its pipeline exchange in plain 1F1B and overlaps it in interleaved 1F1B;
DeepSpeed's PipelineEngine blocks on every send and receive (CostOptions.p2p_mode). Megatron-LM's
MoE blocks on DeepEP launch its MoE layer's ops (CostOptions.megatron_moe_ops). Without a
runtime, sends overlap compute, as torch.distributed.pipelining's isend / irecv do. torchtitan
and torch tensor parallelism is DTensor's: each backward collective is its own autograd op,
waited on before the next GEMM, with no re-gather (CostOptions.tp_backward_overlap "none");
Megatron-LM and no runtime keep Megatron's asynchronous column-parallel backward ("async").
torchtitan's sequence parallelism shards (batch, seq, hidden) activations on the sequence dim,
so each of its collectives copies the gathered activation (CostOptions.sp_seq_dim_copies); the
torch script checkpoints with torch's non-reentrant checkpoint and its default early stop, so
full recompute skips the MLP down projection (CostOptions.recompute_early_stop), which
torchtitan 0.3.0's FullAC turns off (`early_stop=False`). Weight gradients: Megatron-LM's
GEMMs accumulate into its fp32 main gradients in place; torchtitan's FSDP2 reduce-scatters each
micro-batch's new gradient and DeepSpeed's engine takes each one as it comes (nothing
accumulated at full size); the torch script's pipelining schedules let autograd add each
micro-batch's gradient into `.grad`, which a profile (`--profile`, as validate_node uses) already
holds, since `planner profile` accumulates gradients across its repeats: not charged again
(CostOptions.wgrad_accumulation)."""


def default_attention(runtime: str | None, gpu: GpuSpec | None) -> str:
    """The attention kernel `runtime` runs on `gpu`. Megatron-LM (the default runtime) runs
    Transformer Engine's DotProductAttention, which prefers cuDNN fused attention on Hopper and
    later and FlashAttention-2 before (NeMo docs, memory_optimizations.rst, 'Flash Attention':
    "Transformer Engine prefers cuDNN flash attention on Hopper+ architectures, and Tri Dao
    flash attention on pre-Hopper"): cuDNN wherever the GPU preset has a measured cuDNN kernel.
    torchtitan, torch.distributed.pipelining and DeepSpeed (Hugging Face models) call torch's
    scaled_dot_product_attention, whose flash backend is FlashAttention-2 (torch bundles FA2,
    not FA3)."""
    if runtime in (None, "megatron") and gpu is not None and gpu.efficiency.cudnn_fwd is not None:
        return "cudnn"
    return "flash2"


def runtime_cost_options(runtime: str | None, gpu: GpuSpec | None = None, attention: str | None = None,
                         cuda_graphs: bool = False, interference: bool = True) -> CostOptions:
    """The cost model's options for plans that `runtime` will run on `gpu` (defaults:
    Megatron-LM's), with the attention kernel named or the runtime's default on that GPU."""
    if runtime is not None:
        _check_known(runtime, RUNTIME_RULES)
    return CostOptions(**RUNTIME_COSTS.get(runtime or "", {}),
                       attention=attention or default_attention(runtime, gpu),
                       cuda_graphs=cuda_graphs, interference=interference)


def restrict(space: SearchSpace, runtime: str) -> SearchSpace:
    """The space narrowed to what `runtime` can run."""
    _check_known(runtime, RUNTIME_RULES)
    changes = {}
    for field, allowed in RUNTIME_RULES[runtime].items():
        if field == "per_rank_recompute":
            changes[field] = space.per_rank_recompute and allowed
            continue
        current = getattr(space, field)
        kept = allowed if current is None else tuple(v for v in current if v in allowed)
        if not kept:
            raise PlannerError(
                f"{runtime} runs {field} {', '.join(map(str, allowed))} only, but the search was "
                f"restricted to {', '.join(map(str, current))}"
            )
        changes[field] = kept
    named = changes.get("schedules", space.schedules)
    if named is not None:  # no runtime runs chimera or seq1f1b (every exporter refuses them)
        runnable = tuple(name for name in named if name not in SIMULATED_ONLY_SCHEDULES)
        if not runnable:
            raise PlannerError(f"{runtime} runs none of the schedules {', '.join(named)}: no runtime the planner "
                               "exports to runs them; plan for no runtime to compare them")
        changes["schedules"] = runnable
    return replace(space, **changes)


def runtime_check(runtime: str, spec: ModelSpec, cluster: Cluster, global_batch: int, seq: int,
                  options: CostOptions | None = None):
    """A search `accept` callback: None when `runtime`'s exporter takes the layout (as priced
    under `options`: its precision and MoE mechanisms), else its reason (less its advice to
    re-plan for `runtime`, which is what the search is doing)."""
    _check_known(runtime, EXPORTERS)
    summary = ClusterSummary(gpu=cluster.gpu.name, num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node)

    def check(layout: Layout) -> str | None:
        priced = {} if options is None else priced_options(options, spec, layout)
        entry = entry_from_layout(layout, global_batch, seq, None, **priced)
        document = PlanFile(plans=[entry], model=spec, cluster=summary, planner_version="", cost_source="")
        reason = refusal(document, runtime)
        return None if reason is None else reason.replace(f"; {replan_for(runtime)}", "")

    return check


def with_runtimes(document: PlanFile) -> PlanFile:
    """The plan file with each plan's `runtimes`: those whose exporter takes it as it is."""
    plans = [entry.model_copy(update={"runtimes": runs_on(document, index)})
             for index, entry in enumerate(document.plans)]
    return document.model_copy(update={"plans": plans})


def model_refusal(spec: ModelSpec, runtime: str) -> str | None:
    """Why `runtime` runs no layout of `spec` at all (its exporter refuses the simplest one:
    one GPU, no pipeline, no recompute), or None when the model itself is no obstacle."""
    entry = PlanEntry(tp=1, pp=1, dp=1, mbs=1, num_microbatches=1, global_batch=1, seq=128, schedule="1f1b",
                      stage_layers=[(0, spec.num_layers)])
    return refusal(PlanFile(plans=[entry], model=spec), runtime)


def model_runtimes(spec: ModelSpec) -> list[str]:
    """The runtimes that run some layout of `spec` (see `model_refusal`)."""
    return [name for name in EXPORTERS if model_refusal(spec, name) is None]


def _check_known(runtime: str, known: dict) -> None:
    """Refuse a runtime name that `known` does not hold, naming the ones it does."""
    if runtime not in known:
        raise PlannerError(f"unknown runtime '{runtime}': choose one of {', '.join(known)}")
