"""Options shared by several commands, and building the model, cluster and cost model from them."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.calibration import schema as calibration_schema
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import AnalyticSource, CostModel, CostOptions, analytic_compute
from planner.cost.shapes import LAYER_KINDS
from planner.errors import ConfigError, LayoutError, PlannerError
from planner.layout import Layout
from planner.predict import layout_shard
from planner.search.search import Accept
from planner.spec import Cluster, ModelSpec

MODEL = typer.Option(..., "--model", "-m", help="Preset name (see `planner models`) or a config.json path.")
GPU = typer.Option("h100", "--gpu", help="GPU preset (see `planner gpus`).")
GPUS = typer.Option(..., "--gpus", "-n", help="Number of GPUs.", min=1)
SEQ = typer.Option(..., "--seq", "-s", help="Sequence length, tokens.", min=1)
GLOBAL_BATCH = typer.Option(..., "--global-batch", "-b", help="Global batch, sequences per step.", min=1)
GPUS_PER_NODE = typer.Option(None, "--gpus-per-node", help="Override the preset's GPUs per node.", min=1)
INTRA_BW = typer.Option(None, "--intra-node-bw", help="Scale-up GB/s per GPU per direction (default: preset).")
INTER_BW = typer.Option(None, "--inter-node-bw", help="Scale-out GB/s per GPU per direction (default: preset).")
MAX_MEMORY = typer.Option(None, "--max-memory-gb", help="Memory a plan may use per GPU, GiB (default: the GPU's).")
PROFILE = typer.Option(None, "--profile", help="Measured profile (JSON): its times where it spans a shape, "
                       "elsewhere the analytic model calibrated on it.")
PROFILE_ONLY = typer.Option(False, "--profile-only", help="With --profile: keep only layouts whose shapes the "
                            "profile spans (no calibrated costs).")
JSON = typer.Option(False, "--json", help="Print the JSON contract instead of tables.")
OUT = typer.Option(None, "--out", "-o", help="Also write the plan file for `planner export`.")
CALIBRATION = typer.Option(None, "--calibration", help="Calibration file from `planner calibrate --from-log`: "
                           "the GPU's efficiencies fitted to your own runs.")

# Attention kernel, CUDA graphs and overlap interference (issue 12, points 2-4).
ATTENTION = typer.Option(None, "--attention", help="Attention kernel: flash2, flash3, cudnn, triton_fa1 "
                         "(llm-foundry's Triton FlashAttention, attn_impl 'triton') or unfused "
                         "(default: the runtime's on this GPU: Megatron-LM cudnn on Hopper, else flash2).")
CUDA_GRAPHS = typer.Option(False, "--cuda-graphs", help="The runtime replays CUDA graphs: no host "
                           "launch time per kernel.")
INTERFERENCE = typer.Option(True, "--interference/--no-interference", help="Charge the slowdown that "
                            "communication overlapped with compute causes in it.")
STRAGGLERS = typer.Option(True, "--stragglers/--no-stragglers", help="Charge the job's slowest GPU: compute "
                          "runs at the expected slowest of the job's GPUs under a measured per-GPU speed spread "
                          "(docs/stragglers.md).")
SPEED_SPREAD = typer.Option(None, "--gpu-speed-spread", help="Per-GPU speed population for --stragglers: a "
                            "built-in name (v100-longhorn-sgemm, a100-ls6-resnet50) or a file from "
                            "scripts/measure_gpu_speed.py (default: the GPU preset's).")


# Mixture of experts and FP8 (issue 14).
EP = typer.Option(1, "--ep", min=1, help="Expert-parallel degree (MoE).")
ETP = typer.Option(None, "--etp", min=1, help="Expert tensor-parallel degree (MoE; default: tp).")
EP_LIST = typer.Option(None, "--ep", help="Expert-parallel degrees to try (MoE; default: 1 and the powers "
                       "of two dividing the experts that fold over TP x CP x DP).")
ETP_LIST = typer.Option(None, "--etp", help="Expert tensor-parallel degrees to try (MoE; default: 1 and TP).")
PRECISION = typer.Option("bf16", "--precision", help="GEMM precision of the linear layers: bf16 or fp8 "
                         "(attention, norms, communication and the optimizer stay bf16/fp32).")
MOE_IMBALANCE = typer.Option(None, "--moe-imbalance", help="Busiest expert-parallel rank's tokens over the "
                             "mean under dropless routing (default 1.23: FEPLB's per-micro-batch training "
                             "measurement, GLM-5 at EP 8; docs/moe.md lists the published figures checked). Set it "
                             "from your router statistics.")


MOE_DISPATCHER = typer.Option("alltoall", "--moe-dispatcher", help="MoE token dispatcher the plans are priced "
                              "with: alltoall (NCCL all-to-all of every routed copy) or deepep (DeepEP's kernels, one "
                              "copy per destination node or rank, at DeepEP's measured bandwidths; Megatron-LM's "
                              "flex dispatcher). Changes nothing on a dense model.")
MOE_EP_OVERLAP = typer.Option(False, "--moe-ep-overlap/--no-moe-ep-overlap", help="Price Megatron-LM's "
                              "combined-1F1B all-to-all overlap (--overlap-moe-expert-parallel-comm "
                              "--delay-wgrad-compute) where Megatron runs it: EP > 1, no pipeline or interleaved "
                              "1F1B, no full recompute, at most one MTP layer. Changes nothing on a dense model.")


def moe_cost_options(options: CostOptions, precision: str, moe_imbalance: float | None,
                     moe_dispatcher: str = "alltoall", moe_ep_overlap: bool = False) -> CostOptions:
    """`options` with the --precision, --moe-imbalance, --moe-dispatcher and --moe-ep-overlap
    choices (the MoE ones are accepted on a dense model, where they change no cost)."""
    from dataclasses import replace

    from planner.cost.model import PRECISIONS
    from planner.cost.moe import MOE_DISPATCHERS

    if precision not in PRECISIONS:
        raise LayoutError(f"unknown precision '{precision}': choose {', '.join(PRECISIONS)}")
    if moe_imbalance is not None and moe_imbalance < 1:
        raise LayoutError(f"--moe-imbalance is the busiest rank's tokens over the mean, at least 1; got {moe_imbalance}")
    if moe_dispatcher not in MOE_DISPATCHERS:
        raise LayoutError(f"unknown --moe-dispatcher '{moe_dispatcher}': choose {', '.join(MOE_DISPATCHERS)}")
    changes = {"precision": precision, "moe_dispatcher": moe_dispatcher, "moe_ep_overlap": moe_ep_overlap}
    if moe_imbalance is not None:
        changes["moe_imbalance"] = moe_imbalance
    return replace(options, **changes)


def straggler_cost_options(options: CostOptions, stragglers: bool, speed_spread: str | None) -> CostOptions:
    """`options` with the --stragglers and --gpu-speed-spread choices (the spread is read
    now, so a bad name or file is refused before any search)."""
    from dataclasses import replace

    from planner.cost.stragglers import load_speed_spread

    if speed_spread is not None:
        load_speed_spread(speed_spread)
    return replace(options, stragglers=stragglers, speed_spread=speed_spread)


def moe_mechanisms_text(options: CostOptions, spec: ModelSpec) -> str:
    """', DeepEP dispatch, combined-1F1B a2a overlap' for a title when an MoE model's plans are
    priced with them (where they apply: each plan records whether they did), else ''."""
    if not spec.is_moe:
        return ""
    named = (["DeepEP dispatch"] if options.moe_dispatcher == "deepep" else []) + (
        ["combined-1F1B a2a overlap"] if options.moe_ep_overlap else [])
    return "".join(f", {name}" for name in named)


def check_moe_runtime(runtime: str | None, spec: ModelSpec, moe_dispatcher: str, moe_ep_overlap: bool) -> None:
    """Refuse a --runtime that does not run the MoE mechanism an MoE model's plans would be
    priced with (a dense model's are not: nothing to refuse)."""
    from planner.export import mechanism_refusal

    if runtime is None or not spec.is_moe:
        return
    refused = mechanism_refusal(runtime, moe_dispatcher, moe_ep_overlap)
    if refused is not None:
        field, why = refused
        flag = "--moe-ep-overlap" if field == "moe_ep_overlap" else f"--moe-dispatcher {moe_dispatcher}"
        raise LayoutError(f"{flag}: {runtime} {why}; drop the option or plan for another runtime")


def check_attention(attention: str | None, runtime: str | None = None) -> str | None:
    """The --attention value, refused with the choices when unknown, or when --runtime names
    a runtime that does not run that kernel."""
    from planner.cost.compute import ATTENTION_IMPLS
    from planner.export.common import attention_refusal

    if attention is not None and attention not in ATTENTION_IMPLS:
        raise LayoutError(f"unknown attention kernel '{attention}': choose {', '.join(ATTENTION_IMPLS)}")
    refused = attention_refusal(runtime, attention) if runtime is not None else None
    if refused is not None:
        raise LayoutError(f"--attention {attention}: {refused}")
    return attention

# Restrictions of the search space (`plan`, and `profile --for-plan`, which profiles what they allow).
TP_LIST = typer.Option(None, "--tp", help="Tensor-parallel degrees to try, e.g. 4,8.")
PP_LIST = typer.Option(None, "--pp", help="Pipeline-parallel degrees to try.")
CP_LIST = typer.Option(None, "--cp", help="Context-parallel degrees (default: 1, and powers "
                       "of two for sequences of 16k tokens or more).")
VPP_LIST = typer.Option(None, "--vpp", help="Virtual stages per rank to try (default 1..8).")
MBS_LIST = typer.Option(None, "--mbs", help="Micro-batch sizes to try (default 1,2,4,8).")
SCHEDULE_LIST = typer.Option(None, "--schedules", help="Schedules to try (default: all but chimera and "
                             "seq1f1b, which no runtime the exporters target runs; name them to compare them).")
RECOMPUTE_LIST = typer.Option(None, "--recompute", help="Recompute modes to try (default none,selective,full).")
PER_RANK_RECOMPUTE = typer.Option(True, "--per-rank-recompute/--uniform-recompute",
                                  help="Let each pipeline rank pick its own recompute mode.")
SEQUENCE_PARALLEL = typer.Option(None, "--sp/--no-sp", help="Fix sequence parallelism (default: try both with TP).")
ZERO_LIST = typer.Option(None, "--zero", help="ZeRO stages to try (default 1).")
RUNTIME = typer.Option(None, "--runtime", help="Keep only what this runtime runs: "
                       "megatron, torchtitan, torch, deepspeed.")

PROFILE_ONLY_REASON = "needs a shape the profile does not span (--profile-only)"
"""Why --profile-only drops a layout (the key of its count in the search's rejections)."""
PROFILED_OOM_REASON = "runs a layer at a shape that ran out of memory when profiled"


def build_cluster(
    gpu: str,
    num_gpus: int,
    gpus_per_node: int | None = None,
    intra_node_bw: float | None = None,
    inter_node_bw: float | None = None,
    max_memory_gb: float | None = None,
    calibration: calibration_schema.CalibrationFile | None = None,
) -> Cluster:
    """A Cluster of `num_gpus` preset GPUs with the given overrides (and, with a calibration,
    the GPU's efficiencies replaced by the fitted ones)."""
    spec = resolve_gpu(gpu)
    if calibration is not None:
        if calibration.gpu != spec.name:
            raise ConfigError(f"the calibration file describes GPU {calibration.gpu}, but --gpu is {spec.name}")
        spec = spec.model_copy(update={"efficiency": calibration.efficiency})
    return Cluster.of(
        spec,
        num_gpus,
        gpus_per_node=gpus_per_node,
        intra_node_bw_gbps=intra_node_bw,
        inter_node_bw_gbps=inter_node_bw,
        memory_limit_gib=max_memory_gb,
    )


def build_cost_model(
    spec: ModelSpec, cluster: Cluster, profile: Path | None, options: CostOptions = CostOptions(),
    profile_only: bool = False,
) -> CostModel:
    """The cost model: analytic, or on a measured profile where it spans a shape and the
    analytic model calibrated on that profile elsewhere (and for the recomputation and
    overlap estimates the cost model makes itself)."""
    if profile is None:
        if profile_only:
            raise PlannerError("--profile-only needs --profile FILE")
        return CostModel(spec, cluster, options)
    from planner.cost.calibrate import fit_file, fitted_gpu
    from planner.cost.comm import Network
    from planner.profile.lookup import MeasuredFirst, profiled_source
    from planner.profile.node_comm import network_curves

    measured = profiled_source(profile, spec, cluster.gpu)
    # the node's measured collectives replace the model for groups inside one node
    network = Network.of(cluster, measured=network_curves(measured.profile))
    try:
        calibration = fit_file(profile, measured.profile, cluster.gpu)
    except PlannerError:  # nothing to fit on (only recompute rows): the preset's efficiencies
        fallback = AnalyticSource(spec, analytic_compute(cluster.gpu, options))
        return CostModel(spec, cluster, options, MeasuredFirst(measured, fallback, "analytic"), network)
    gpu = fitted_gpu(cluster.gpu, calibration.efficiency, measured.profile.dtype, options.dtype)
    fallback = AnalyticSource(spec, analytic_compute(gpu, options))  # as the fit: flash, fused traffic
    source = MeasuredFirst(measured, fallback, "calibrated", calibration)
    return CostModel(spec, cluster.model_copy(update={"gpu": gpu}), options, source, network)


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
    return (f"calibrated: the analytic model fitted to {calibration.num_samples} measured times of "
            f"{', '.join(kinds)} in {cost_model.source.name.removeprefix('profile:')} (mean abs error "
            f"{calibration.before_pct:.0f}% -> {calibration.after_pct:.0f}%)")


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
            if any(source.ran_out_of_memory(kind, shard, mode) for mode in (modes if kind == "transformer" else {"none"})):
                return PROFILED_OOM_REASON
        if profile_only and any(source.source_of(kind, shard) != "measured" for kind in LAYER_KINDS):
            return PROFILE_ONLY_REASON
        return None

    return check


def load_calibration(path: Path | None) -> calibration_schema.CalibrationFile | None:
    """The calibration file named by --calibration, or None."""
    return None if path is None else calibration_schema.load(path)


def cost_source(cost_model: CostModel, calibration: calibration_schema.CalibrationFile | None) -> str:
    """The plan file's `cost_source`: the compute source, and the calibration when one is used."""
    if calibration is None:
        return cost_model.source.name
    runs = calibration.num_runs
    return f"{cost_model.source.name}, calibrated from {runs} run{'s' if runs != 1 else ''}"


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
