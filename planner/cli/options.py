"""Options shared by several commands, and the `Request` they describe (planner/job.py builds the job)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from planner.catalog import resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import LAYER_KINDS
from planner.errors import LayoutError
from planner.layout import Layout
from planner.predict import layout_shard
from planner.request import Request
from planner.search.search import Accept
from planner.search.space import SearchSpace
from planner.spec import ModelSpec

MODEL = typer.Option(
    ..., "--model", "-m", help="Preset name (see `planner models`), a config.json path or the folder holding it."
)
GPU = typer.Option("h100", "--gpu", help="GPU preset (see `planner gpus`).")
GPUS = typer.Option(..., "--gpus", "-n", help="Number of GPUs.", min=1)
SEQ = typer.Option(..., "--seq", "-s", help="Sequence length, tokens.", min=1)
GLOBAL_BATCH = typer.Option(..., "--global-batch", "-b", help="Global batch, sequences per step.", min=1)
GPUS_PER_NODE = typer.Option(None, "--gpus-per-node", help="Override the preset's GPUs per node.", min=1)
INTRA_BW = typer.Option(None, "--intra-node-bw", help="Scale-up GB/s per GPU per direction (default: preset).")
INTER_BW = typer.Option(None, "--inter-node-bw", help="Scale-out GB/s per GPU per direction (default: preset).")
MAX_MEMORY = typer.Option(None, "--max-memory-gb", help="Memory a job may use per GPU, GiB (default: the GPU's).")
MEMORY_HEADROOM = typer.Option(
    None,
    "--memory-headroom",
    help="Share of the memory plans keep free, 0 to 0.5 (default: the development set's largest "
    "memory under-prediction; `planner plan` prints it).",
)
PROFILE = typer.Option(
    None,
    "--profile",
    help="Measured profile (JSON): its times where it spans a shape, elsewhere the analytic model calibrated on it.",
)
PROFILE_ONLY = typer.Option(
    False,
    "--profile-only",
    help="With --profile: keep only layouts whose shapes the profile spans (no calibrated costs).",
)
JSON = typer.Option(False, "--json", help="Print the JSON contract instead of tables.")
OUT = typer.Option(None, "--out", "-o", help="Also write the plan file for `planner export`.")
FORCE = typer.Option(False, "--force", help="Overwrite output files that exist (refused without it).")
WIDE = typer.Option(
    False, "--wide", help="List every stage's layer count under the table instead of the runs of equal stages (3×20)."
)
CALIBRATION = typer.Option(
    None,
    "--calibration",
    help="Calibration file from `planner calibrate --from-log`: the GPU's efficiencies fitted to your own runs.",
)

# Cost options with a flag of their own (the rest: --set NAME=VALUE).
ATTENTION = typer.Option(
    None,
    "--attention",
    help="Attention kernel: flash1 (FlashAttention-1's CUDA kernel), flash2, flash3, cudnn, triton_fa1 "
    "(llm-foundry's Triton FlashAttention, attn_impl 'triton') or unfused "
    "(default: the runtime's on this GPU: Megatron-LM cudnn on Hopper, else flash2).",
)
CUDA_GRAPHS = typer.Option(
    None, "--cuda-graphs/--no-cuda-graphs", help="The runtime replays CUDA graphs: no host launch time per kernel."
)
INTERFERENCE = typer.Option(
    None,
    "--interference/--no-interference",
    help="Charge the slowdown that communication overlapped with compute causes in it.",
)
STRAGGLERS = typer.Option(
    None,
    "--stragglers/--no-stragglers",
    help="Charge the job's slowest GPU: compute "
    "runs at the expected slowest of the job's GPUs under a measured per-GPU speed spread "
    "(docs/stragglers.md).",
)
SPEED_SPREAD = typer.Option(
    None,
    "--gpu-speed-spread",
    help="Per-GPU speed population for --stragglers: a "
    "built-in name (v100-longhorn-sgemm, a100-ls6-resnet50) or a file from "
    "scripts/measure_gpu_speed.py (default: the GPU preset's).",
)


# Mixture of experts and FP8.
EP = typer.Option(1, "--ep", min=1, help="Expert-parallel degree (MoE).")
ETP = typer.Option(None, "--etp", min=1, help="Expert tensor-parallel degree (MoE; default: tp).")
EP_LIST = typer.Option(
    None,
    "--ep",
    help="Expert-parallel degrees to try (MoE; default: 1 and the powers "
    "of two dividing the experts that fold over TP x CP x DP).",
)
ETP_LIST = typer.Option(None, "--etp", help="Expert tensor-parallel degrees to try (MoE; default: 1 and TP).")
PRECISION = typer.Option(
    None,
    "--precision",
    help="GEMM precision of the linear layers: bf16 or fp8 "
    "(attention, norms, communication and the optimizer stay bf16/fp32).",
)
MOE_IMBALANCE = typer.Option(
    None,
    "--moe-imbalance",
    help="Busiest expert-parallel rank's tokens over the "
    "mean under dropless routing (default 1.23: FEPLB's per-micro-batch training "
    "measurement, GLM-5 at EP 8; docs/moe.md lists the published figures checked). Set it "
    "from your router statistics.",
)


MOE_DISPATCHER = typer.Option(
    None,
    "--moe-dispatcher",
    help="MoE token dispatcher the plans are priced "
    "with: alltoall (NCCL all-to-all of every routed copy) or deepep (DeepEP's kernels, one "
    "copy per destination node or rank, at DeepEP's measured bandwidths; Megatron-LM's "
    "flex dispatcher). Changes nothing on a dense model.",
)
MOE_EP_OVERLAP = typer.Option(
    None,
    "--moe-ep-overlap/--no-moe-ep-overlap",
    help="Price Megatron-LM's "
    "combined-1F1B all-to-all overlap (--overlap-moe-expert-parallel-comm "
    "--delay-wgrad-compute) where Megatron runs it: EP > 1, no pipeline or interleaved "
    "1F1B, no full recompute, at most one MTP layer. Changes nothing on a dense model.",
)


def moe_mechanisms_text(options: CostOptions, spec: ModelSpec) -> str:
    """', DeepEP dispatch, combined-1F1B a2a overlap' for a title when an MoE model's plans are
    priced with them (where they apply: each plan records whether they did), else ''."""
    if not spec.is_moe:
        return ""
    named = (["DeepEP dispatch"] if options.moe.moe_dispatcher == "deepep" else []) + (
        ["combined-1F1B a2a overlap"] if options.moe.moe_ep_overlap else []
    )
    return "".join(f", {name}" for name in named)


# Restrictions of the search space (`plan`, and `profile --for-plan`, which profiles what they allow).
TP_LIST = typer.Option(None, "--tp", help="Tensor-parallel degrees to try, e.g. 4,8.")
PP_LIST = typer.Option(None, "--pp", help="Pipeline-parallel degrees to try.")
CP_LIST = typer.Option(
    None, "--cp", help="Context-parallel degrees (default: 1, and powers of two for sequences of 16k tokens or more)."
)
VPP_LIST = typer.Option(None, "--vpp", help="Virtual stages per rank to try (default 1..8).")
MBS_LIST = typer.Option(None, "--mbs", help="Micro-batch sizes to try (default 1,2,4,8).")
SCHEDULE_LIST = typer.Option(
    None,
    "--schedules",
    help="Schedules to try (default: all but chimera and "
    "seq1f1b, which no runtime the exporters target runs; name them to compare them).",
)
RECOMPUTE_LIST = typer.Option(None, "--recompute", help="Recompute modes to try (default none,selective,full).")
PER_RANK_RECOMPUTE = typer.Option(
    True, "--per-rank-recompute/--uniform-recompute", help="Let each pipeline rank pick its own recompute mode."
)
SEQUENCE_PARALLEL = typer.Option(None, "--sp/--no-sp", help="Fix sequence parallelism (default: try both with TP).")
ZERO_LIST = typer.Option(None, "--zero", help="ZeRO stages to try (default 1).")
RUNTIME = typer.Option(
    None,
    "--runtime",
    help="The runtime that runs the plans, NAME[@VERSION] (see `planner "
    "runtimes`): its cost behaviours, and with plan, only what it runs (default: planner's "
    "Megatron-LM kernels, any layout).",
)
SET = typer.Option(
    None,
    "--set",
    help="Set one cost option over the runtime's, NAME=VALUE (repeatable; `planner runtimes --options` lists them).",
)

PROFILE_ONLY_REASON = "needs a shape the profile does not span (--profile-only)"
"""Why --profile-only drops a layout (the key of its count in the search's rejections)."""
PROFILED_OOM_REASON = "runs a layer at a shape that ran out of memory when profiled"


def cost_sources(cost_model: CostModel, layout: Layout, seq: int) -> dict[str, str]:
    """Per layer kind, where the layout's compute times came from: measured, calibrated or analytic."""
    source_of = getattr(cost_model.source, "source_of", None)
    shard = layout_shard(layout, seq)
    return {kind: source_of(kind, shard) if source_of else "analytic" for kind in LAYER_KINDS}


def sources_text(sources: dict[str, str]) -> str:
    """'all measured', or 'transformer measured, embedding measured, head calibrated'."""
    if len(set(sources.values())) == 1:
        return f"all {next(iter(sources.values()))}"
    return ", ".join(f"{kind} {sources[kind]}" for kind in ("transformer", "embedding", "head") if kind in sources)


def calibration_text(cost_model: CostModel) -> str | None:
    """What the calibrated costs were fitted on, or None without a calibration."""
    calibration = getattr(cost_model.source, "calibration", None)
    if calibration is None:
        return None
    kinds = sorted({p.kind for p in calibration.parts}, key=LAYER_KINDS.index)
    return (
        f"calibrated: the analytic model fitted to {calibration.num_samples} measured times of "
        f"{', '.join(kinds)} in {cost_model.source.name.removeprefix('profile:')} (mean abs error "
        f"{calibration.before_pct:.0f}% -> {calibration.after_pct:.0f}%)"
    )


def accept_checks(*checks: Accept | None) -> Accept | None:
    """One check from several (the first reason wins); None when there are none."""
    active = [c for c in checks if c is not None]
    if not active:
        return None
    return lambda layout: next((r for r in (c(layout) for c in active) if r is not None), None)


def profile_check(cost_model: CostModel, seq: int, profile_only: bool) -> Accept | None:
    """With a profile: refuses layouts running a layer at a shape the profile recorded out of
    memory (in that recompute mode), and under --profile-only those with a layer kind the
    profile does not span. None without a profile."""
    source = cost_model.source
    if not hasattr(source, "ran_out_of_memory"):
        return None

    def check(layout: Layout) -> str | None:
        shard = layout_shard(layout, seq)
        modes = {mode for mode in layout.recompute if mode in ("none", "full")}
        for kind in LAYER_KINDS:
            if any(
                source.ran_out_of_memory(kind, shard, mode) for mode in (modes if kind == "transformer" else {"none"})
            ):
                return PROFILED_OOM_REASON
        if profile_only and any(source.source_of(kind, shard) != "measured" for kind in LAYER_KINDS):
            return PROFILE_ONLY_REASON
        return None

    return check


def load_model(name_or_path: str) -> ModelSpec:
    """The model named on the command line."""
    return resolve_model(name_or_path)


def int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    """'4,8' -> (4, 8); None stays None."""
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise LayoutError(f"{flag} takes comma-separated integers, got '{text}'") from None
    if any(v < 0 for v in values):
        raise LayoutError(f"{flag} values must not be negative, got '{text}'")
    return values


def name_list(text: str | None) -> tuple[str, ...] | None:
    """'1f1b,zb_h1' -> ('1f1b', 'zb_h1'); None stays None."""
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def request_of(
    model: str,
    gpus: int,
    gpu: str,
    global_batch: int = 1,
    seq: int = 1,
    *,
    gpus_per_node: int | None = None,
    intra_node_bw: float | None = None,
    inter_node_bw: float | None = None,
    max_memory_gb: float | None = None,
    memory_headroom: float | None = None,
    runtime: str | None = None,
    attention: str | None = None,
    precision: str | None = None,
    moe_imbalance: float | None = None,
    moe_dispatcher: str | None = None,
    moe_ep_overlap: bool | None = None,
    cuda_graphs: bool | None = None,
    interference: bool | None = None,
    stragglers: bool | None = None,
    speed_spread: str | None = None,
    sets: list[str] | None = None,
    profile: Path | None = None,
    profile_only: bool = False,
    calibration: Path | None = None,
) -> Request:
    """The request the shared command-line options describe (cost options only where a flag
    was given, so the runtime version's own hold elsewhere)."""
    from planner.cost.compute import ATTENTION_IMPLS
    from planner.cost.model import PRECISIONS
    from planner.cost.moe import MOE_DISPATCHERS
    from planner.job import parse_setting

    if attention is not None and attention not in ATTENTION_IMPLS:
        raise LayoutError(f"unknown attention kernel '{attention}': choose {', '.join(ATTENTION_IMPLS)}")
    if precision is not None and precision not in PRECISIONS:
        raise LayoutError(f"unknown precision '{precision}': choose {', '.join(PRECISIONS)}")
    if moe_imbalance is not None and moe_imbalance < 1:
        raise LayoutError(
            f"--moe-imbalance is the busiest rank's tokens over the mean, at least 1; got {moe_imbalance}"
        )
    if memory_headroom is not None and not 0 <= memory_headroom <= 0.5:
        raise LayoutError(f"--memory-headroom is a share of the memory, 0 to 0.5; got {memory_headroom}")
    if moe_dispatcher is not None and moe_dispatcher not in MOE_DISPATCHERS:
        raise LayoutError(f"unknown --moe-dispatcher '{moe_dispatcher}': choose {', '.join(MOE_DISPATCHERS)}")
    given = {
        "attention": attention,
        "precision": precision,
        "moe_imbalance": moe_imbalance,
        "moe_dispatcher": moe_dispatcher,
        "moe_ep_overlap": moe_ep_overlap,
        "cuda_graphs": cuda_graphs,
        "interference": interference,
        "stragglers": stragglers,
        "speed_spread": speed_spread,
    }
    settings = {name: value for name, value in given.items() if value is not None}
    settings.update(parse_setting(text) for text in sets or ())
    return Request(
        model=model,
        gpu=gpu,
        num_gpus=gpus,
        global_batch=global_batch,
        seq=seq,
        gpus_per_node=gpus_per_node,
        intra_node_bw_gbps=intra_node_bw,
        inter_node_bw_gbps=inter_node_bw,
        max_memory_gb=max_memory_gb,
        memory_headroom=memory_headroom,
        runtime=runtime,
        options=settings,
        profile=None if profile is None else str(profile),
        profile_only=profile_only,
        calibration=None if calibration is None else str(calibration),
    )


def space_of(
    tp: str | None = None,
    pp: str | None = None,
    cp: str | None = None,
    vpp: str | None = None,
    mbs: str | None = None,
    ep: str | None = None,
    etp: str | None = None,
    segments: str | None = None,
    schedules: str | None = None,
    recompute: str | None = None,
    per_rank: bool = True,
    sequence_parallel: bool | None = None,
    zero: str | None = None,
    runtime: str | None = None,
) -> SearchSpace:
    """The search space the shared layout restrictions describe (each a comma list as typed;
    None: the search's own range), restricted to what `runtime` runs."""
    from planner.plan import RECOMPUTE_MODES
    from planner.search.runtimes import restrict

    degrees = {
        name: int_list(text, flag)
        for name, text, flag in (
            ("tp", tp, "--tp"),
            ("pp", pp, "--pp"),
            ("cp", cp, "--cp"),
            ("vpp", vpp, "--vpp"),
            ("mbs", mbs, "--mbs"),
            ("ep", ep, "--ep"),
            ("etp", etp, "--etp"),
            ("segments", segments, "--segments"),
        )
    }
    for name, values in degrees.items():
        if values is not None and 0 in values:
            raise LayoutError(f"--{name} values must be at least 1")
    space = SearchSpace(
        **degrees,
        schedules=name_list(schedules),
        recompute=name_list(recompute) or RECOMPUTE_MODES,
        per_rank_recompute=per_rank,
        sequence_parallel=None if sequence_parallel is None else (sequence_parallel,),
        zero=int_list(zero, "--zero") or (1,),
    )
    return restrict(space, runtime) if runtime else space


def space_from(params: Mapping[str, Any], **overrides: Any) -> SearchSpace:
    """The search space of a command's parsed options (typer's `ctx.params`, by parameter
    name: those `space_of` takes), with `overrides`."""
    names = inspect.signature(space_of).parameters
    return space_of(**{name: value for name, value in {**params, **overrides}.items() if name in names})


def request_from(params: Mapping[str, Any], **overrides: Any) -> Request:
    """The request of a command's parsed options (typer's `ctx.params`, by parameter name: those
    `request_of` takes), with `overrides` (e.g. the value a sweep varies)."""
    names = inspect.signature(request_of).parameters
    return request_of(**{name: value for name, value in {**params, **overrides}.items() if name in names})
