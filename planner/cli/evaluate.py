"""`planner evaluate`: predict one fixed layout (for example the one a team runs today)."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.cli import options as opt
from planner.cli.app import app, print_json, stderr, stdout
from planner.cli.report import breakdown_table, plan_file, plan_json, plans_table, write_plan_file
from planner.cli.plan import print_cost_sources
from planner.cli.simulate import DEFAULT_SEGMENTS
from planner.errors import LayoutError, PlannerError
from planner.layout import Layout, check_layout, entry_from_layout, even_stage_layers, stage_layers_from_counts
from planner.plan import RECOMPUTE_MODES
from planner.predict import predict, priced_options
from planner.schedule import check_shape
from planner.schedule.registry import SEGMENTED
from planner.search.runtimes import runtime_cost_options, with_runtimes
from planner.units import GiB


def parse_recompute(text: str, pp: int) -> tuple[str, ...]:
    """One recompute mode for every pipeline rank, or a comma list with one per rank."""
    modes = [m.strip() for m in text.split(",")]
    for mode in modes:
        if mode not in RECOMPUTE_MODES:
            raise LayoutError(f"unknown recompute mode '{mode}': choose {', '.join(RECOMPUTE_MODES)}")
    if len(modes) == 1:
        return (modes[0],) * pp
    if len(modes) != pp:
        raise LayoutError(f"--recompute lists {len(modes)} modes for {pp} pipeline ranks; give 1 or {pp}")
    return tuple(modes)


@app.command("evaluate")
def evaluate_command(
    model: str = opt.MODEL,
    gpus: int = opt.GPUS,
    gpu: str = opt.GPU,
    global_batch: int = opt.GLOBAL_BATCH,
    seq: int = opt.SEQ,
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, help="Pipeline-parallel degree (ranks)."),
    cp: int = typer.Option(1, "--cp", min=1, help="Context-parallel degree."),
    vpp: int = typer.Option(1, "--vpp", min=1, help="Virtual stages (chunks) per pipeline rank."),
    mbs: int = typer.Option(1, "--mbs", min=1, help="Micro-batch size, sequences."),
    schedule: str | None = typer.Option(None, "--schedule", help="Pipeline schedule (default: 1f1b, "
                                        "or interleaved_1f1b when --vpp > 1)."),
    segments: int | None = typer.Option(None, "--segments", min=1, help="seq1f1b: sequence segments per "
                                        "micro-batch (default 4)."),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full, or one per "
                                  "pipeline rank as a comma list."),
    sequence_parallel: bool | None = typer.Option(None, "--sp/--no-sp", help="Sequence parallelism "
                                                  "(default: on when tp > 1)."),
    zero: int = typer.Option(1, "--zero", min=0, max=3, help="ZeRO stage (1 = distributed optimizer)."),
    ep: int = opt.EP,
    etp: int | None = opt.ETP,
    precision: str = opt.PRECISION,
    moe_imbalance: float | None = opt.MOE_IMBALANCE,
    moe_dispatcher: str = opt.MOE_DISPATCHER,
    moe_ep_overlap: bool = opt.MOE_EP_OVERLAP,
    stage_layers: str | None = typer.Option(None, "--stage-layers", help="Layers per virtual stage in "
                                            "model order, comma-separated (default: as even as possible)."),
    runtime: str | None = typer.Option(None, "--runtime", help="Cost the layout as this runtime runs it "
                                       "(torchtitan: its per-op selective checkpointing); default Megatron-LM's."),
    gpus_per_node: int | None = opt.GPUS_PER_NODE,
    intra_node_bw: float | None = opt.INTRA_BW,
    inter_node_bw: float | None = opt.INTER_BW,
    max_memory_gb: float | None = opt.MAX_MEMORY,
    profile: Path | None = opt.PROFILE,
    attention: str | None = opt.ATTENTION,
    cuda_graphs: bool = opt.CUDA_GRAPHS,
    interference: bool = opt.INTERFERENCE,
    stragglers: bool = opt.STRAGGLERS,
    speed_spread: str | None = opt.SPEED_SPREAD,
    profile_only: bool = opt.PROFILE_ONLY,
    calibration: Path | None = opt.CALIBRATION,
    as_json: bool = opt.JSON,
    out: Path | None = opt.OUT,
) -> None:
    """Predict step time, throughput, MFU, bubble and memory per GPU of one layout."""
    spec = opt.load_model(model)
    calibrated = opt.load_calibration(calibration)
    cluster = opt.build_cluster(gpu, gpus, gpus_per_node, intra_node_bw, inter_node_bw, max_memory_gb, calibrated)
    if gpus % (tp * pp * cp):
        raise LayoutError(f"{gpus} GPUs are not divisible by tp {tp} x pp {pp} x cp {cp} = {tp * pp * cp}")
    dp = gpus // (tp * pp * cp)
    if global_batch % (dp * mbs):
        raise LayoutError(
            f"global batch {global_batch} is not divisible by dp {dp} x mbs {mbs} = {dp * mbs}"
        )
    num_microbatches = global_batch // (dp * mbs)
    schedule = schedule or ("interleaved_1f1b" if vpp > 1 else "1f1b")
    if segments is None:
        segments = DEFAULT_SEGMENTS if schedule in SEGMENTED else 1
    check_shape(schedule, pp, num_microbatches, vpp, segments)
    if stage_layers is None:
        cuts = even_stage_layers(spec.num_layers, pp, vpp, schedule)
    else:
        counts = list(opt.int_list(stage_layers, "--stage-layers"))
        cuts = stage_layers_from_counts(counts, spec.num_layers, pp, vpp, schedule)
    layout = Layout(
        tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, mbs=mbs, num_microbatches=num_microbatches,
        schedule=schedule, recompute=parse_recompute(recompute, pp),
        sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel and tp > 1,
        zero_stage=zero, stage_layers=cuts, ep=ep, etp=etp if spec.is_moe else None, segments=segments,
    )
    check_layout(layout, spec, cluster, global_batch, seq)
    opt.check_moe_runtime(runtime, spec, moe_dispatcher, moe_ep_overlap)
    cost_model = opt.build_cost_model(spec, cluster, profile, opt.straggler_cost_options(opt.moe_cost_options(
        runtime_cost_options(runtime, cluster.gpu, opt.check_attention(attention, runtime),
                             cuda_graphs, interference),
        precision, moe_imbalance, moe_dispatcher, moe_ep_overlap), stragglers, speed_spread), profile_only)
    sources = opt.cost_sources(cost_model, layout, seq)
    if profile_only and (missing := [kind for kind, source in sources.items() if source != "measured"]):
        raise PlannerError(
            f"--profile-only: {profile.name} does not span the {', '.join(missing)} shape of this layout "
            f"(tp={tp} mbs={mbs} seq={seq}{f' cp={cp}' if cp > 1 else ''}); profile it, or drop --profile-only"
        )
    check = opt.profile_check(cost_model, seq, False)
    if check is not None and check(layout) is not None:
        stderr.print(f"warning: this layout {check(layout)} ({profile.name}): it does not fit",
                     markup=False, highlight=False)
    prediction = predict(cost_model, layout, global_batch, seq)
    entry = entry_from_layout(layout, global_batch, seq, prediction.to_predicted(),
                              **priced_options(cost_model.options, spec, layout)).model_copy(
        update={"cost_sources": sources})
    document = with_runtimes(plan_file([entry], spec, cluster, opt.cost_source(cost_model, calibrated)))
    entry = document.plans[0]
    limit = cluster.memory_limit_bytes
    if prediction.peak_memory_bytes > limit:
        stderr.print(
            f"warning: needs {prediction.peak_memory_bytes / GiB:.1f} GiB on its most loaded GPU, "
            f"over the {limit / GiB:.1f} GiB limit: this layout runs out of memory",
            markup=False, highlight=False,
        )
    if out is not None:
        write_plan_file(out, document)
    if as_json:
        print_json(plan_json(document))
        return
    title = (f"{spec.name} on {gpus} x {cluster.gpu.name}, global batch {global_batch} x seq {seq} "
             f"({document.cost_source} costs{opt.moe_mechanisms_text(cost_model.options, spec)})")
    stdout.print(plans_table([entry], title))
    if profile is not None:
        print_cost_sources([entry], cost_model)
    stdout.print(breakdown_table(entry, limit / GiB))
    if out is not None:
        stdout.print(f"wrote {out}", markup=False, highlight=False)
