"""`planner evaluate`: predict one fixed layout (for example the one a team runs today)."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.api import evaluate_layout, layout_of, plan_document
from planner.cli import options as opt
from planner.cli.app import app, print_json, stderr, stdout
from planner.cli.plan import print_cost_sources
from planner.cli.report import breakdown_table, memory_warning, plan_json, plans_view, write_plan_file
from planner.errors import PlannerError
from planner.job import build
from planner.layout import check_layout
from planner.output import refuse_existing
from planner.run_length import expand_counts
from planner.units import GiB


@app.command("evaluate")
def evaluate_command(
    ctx: typer.Context,
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
    schedule: str | None = typer.Option(
        None, "--schedule", help="Pipeline schedule (default: 1f1b, or interleaved_1f1b when --vpp > 1)."
    ),
    segments: int | None = typer.Option(
        None, "--segments", min=1, help="seq1f1b: sequence segments per micro-batch (default 4)."
    ),
    recompute: str = typer.Option(
        "none", "--recompute", help="none | selective | full, or one per pipeline rank as a comma list."
    ),
    sequence_parallel: bool | None = typer.Option(
        None, "--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1)."
    ),
    zero: int = typer.Option(1, "--zero", min=0, max=3, help="ZeRO stage (1 = distributed optimizer)."),
    ep: int = opt.EP,
    etp: int | None = opt.ETP,
    precision: str | None = opt.PRECISION,
    moe_imbalance: float | None = opt.MOE_IMBALANCE,
    moe_dispatcher: str | None = opt.MOE_DISPATCHER,
    moe_ep_overlap: bool | None = opt.MOE_EP_OVERLAP,
    stage_layers: str | None = typer.Option(
        None,
        "--stage-layers",
        help="Layers per virtual stage in model order, comma-separated, runs as COUNTxREPEATS (e.g. 2,3x26,2; default: as even as possible).",
    ),
    runtime: str | None = opt.RUNTIME,
    sets: list[str] | None = opt.SET,
    gpus_per_node: int | None = opt.GPUS_PER_NODE,
    intra_node_bw: float | None = opt.INTRA_BW,
    inter_node_bw: float | None = opt.INTER_BW,
    max_memory_gb: float | None = opt.MAX_MEMORY,
    memory_headroom: float | None = opt.MEMORY_HEADROOM,
    profile: Path | None = opt.PROFILE,
    attention: str | None = opt.ATTENTION,
    cuda_graphs: bool | None = opt.CUDA_GRAPHS,
    interference: bool | None = opt.INTERFERENCE,
    stragglers: bool | None = opt.STRAGGLERS,
    speed_spread: str | None = opt.SPEED_SPREAD,
    profile_only: bool = opt.PROFILE_ONLY,
    calibration: Path | None = opt.CALIBRATION,
    as_json: bool = opt.JSON,
    out: Path | None = opt.OUT,
    force: bool = opt.FORCE,
    wide: bool = opt.WIDE,
) -> None:
    """Predict step time, throughput, MFU, bubble and memory per GPU of one layout."""
    refuse_existing(out, force=force)
    request = opt.request_from(ctx.params)
    job = build(request)
    spec, cluster, cost_model = job.spec, job.cluster, job.cost_model
    layout = layout_of(
        spec,
        request,
        tp=tp,
        pp=pp,
        cp=cp,
        vpp=vpp,
        mbs=mbs,
        schedule=schedule,
        segments=segments,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        zero=zero,
        ep=ep,
        etp=etp,
        stage_layers=None if stage_layers is None else expand_counts(stage_layers, "--stage-layers"),
    )
    check_layout(layout, spec, cluster, global_batch, seq)
    sources = opt.cost_sources(cost_model, layout, seq)
    if profile_only and (missing := [kind for kind, source in sources.items() if source != "measured"]):
        raise PlannerError(
            f"--profile-only: {profile.name} does not span the {', '.join(missing)} shape of this layout "
            f"(tp={tp} mbs={mbs} seq={seq}{f' cp={cp}' if cp > 1 else ''}); profile it, or drop --profile-only"
        )
    check = opt.profile_check(cost_model, seq, False)
    if check is not None and check(layout) is not None:
        stderr.print(
            f"warning: this layout {check(layout)} ({profile.name}): it does not fit", markup=False, highlight=False
        )
    evaluation = evaluate_layout(job, layout)
    prediction = evaluation.prediction
    document = plan_document(job, [evaluation.entry().model_copy(update={"cost_sources": sources})])
    entry = document.plans[0]
    limit = cluster.memory_limit_bytes
    if (warning := memory_warning(prediction.peak_memory_bytes, cluster)) is not None:
        stderr.print(f"warning: {warning}", markup=False, highlight=False)
    if out is not None:
        write_plan_file(out, document)
    if as_json:
        print_json(plan_json(document))
        return
    title = (
        f"{spec.name} on {gpus} x {cluster.gpu.name}, global batch {global_batch} x seq {seq} "
        f"({document.cost_source} costs{opt.moe_mechanisms_text(cost_model.options, spec)})"
    )
    stdout.print(plans_view([entry], title, stdout.width, wide, plan_path=out), soft_wrap=False)
    if profile is not None:
        print_cost_sources([entry], cost_model)
    stdout.print(breakdown_table(entry, limit / GiB))
    if out is not None:
        stdout.print(f"wrote {out}", markup=False, highlight=False)
