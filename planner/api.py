"""The Python API: the same requests, jobs and plans the command line prints as JSON.

    import planner
    request = planner.Request(model="llama3-70b", num_gpus=256, global_batch=512, seq=8192,
                              runtime="megatron@0.19")
    best = planner.plan(request).plans[0]                 # a PlanFile, as `plan --json` prints
    one = planner.evaluate(request, tp=8, pp=4, vpp=2)    # a PlanFile with one plan

`layout_of` and `evaluate_layout` are the steps `planner evaluate` and the published-runs
harness take; `plan` is `planner plan` without the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import ConfigError, LayoutError
from planner.job import Job, build
from planner.layout import (
    Layout,
    check_expert_parallel,
    check_layout,
    check_tensor_parallel,
    entry_from_layout,
    even_stage_layers,
    layout_from_entry,
    stage_layers_from_counts,
)
from planner.plan import RECOMPUTE_MODES, ClusterSummary, PlanEntry, PlanFile
from planner.predict import Prediction, predict, priced_options
from planner.request import Request
from planner.schedule import check_shape
from planner.schedule.registry import default_segments, schedule_info
from planner.search.space import SearchSpace
from planner.spec import ModelSpec
from planner.uncertainty import Interval, interval_from_errors, step_interval
from planner.units import GiB
from planner.version import __version__


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """One layout of a job, priced."""

    job: Job
    layout: Layout
    prediction: Prediction

    def entry(self) -> PlanEntry:
        """The layout and its prediction, with its interval, as the JSON contract's plan entry."""
        request, options = self.job.request, self.job.cost_model.options
        interval = prediction_interval(self.job, self.prediction.step_time_s)
        predicted = self.prediction.to_predicted().model_copy(
            update={"step_time_interval_s": [interval.low_s, interval.high_s], "interval_basis": interval.basis}
        )
        return entry_from_layout(
            self.layout,
            request.global_batch,
            request.seq,
            predicted,
            **priced_options(options, self.job.spec, self.layout),
        )


def prediction_interval(job: Job, step_time_s: float) -> Interval:
    """The interval of a step time of `job`: from its calibration's runs when it has one, else
    from the development set's comparable runs."""
    if job.calibration is not None and job.calibration.residuals:
        errors = [r.predicted_after_s / r.measured_step_time_s - 1 for r in job.calibration.residuals]
        return interval_from_errors(step_time_s, errors, f"{len(errors)} calibration run(s)")
    return step_interval(step_time_s, job.request.runtime, job.cluster.gpu.name, job.cluster.num_gpus, job.spec.is_moe)


def parse_recompute(modes: str | tuple[str, ...], pp: int) -> tuple[str, ...]:
    """One recompute mode for every pipeline rank, or one per rank ('none' or 'full,none,...')."""
    listed = [m.strip() for m in modes.split(",")] if isinstance(modes, str) else list(modes)
    for mode in listed:
        if mode not in RECOMPUTE_MODES:
            raise LayoutError(f"unknown recompute mode '{mode}': choose {', '.join(RECOMPUTE_MODES)}")
    if len(listed) == 1:
        return (listed[0],) * pp
    if len(listed) != pp:
        raise LayoutError(f"--recompute lists {len(listed)} modes for {pp} pipeline ranks; give 1 or {pp}")
    return tuple(listed)


def layout_of(
    spec: ModelSpec,
    request: Request,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    vpp: int = 1,
    mbs: int = 1,
    schedule: str | None = None,
    segments: int | None = None,
    recompute: str | tuple[str, ...] = "none",
    sequence_parallel: bool | None = None,
    zero: int = 1,
    ep: int = 1,
    etp: int | None = None,
    stage_layers: list[int] | None = None,
) -> Layout:
    """The fixed layout `planner evaluate` takes: DP from the GPUs left, micro-batches from the
    global batch, 1F1B (interleaved with vpp > 1), sequence parallelism with TP, even cuts
    unless `stage_layers` (layers per virtual stage in model order) says otherwise."""
    gpus, global_batch = request.num_gpus, request.global_batch
    if gpus % (tp * pp * cp):
        raise LayoutError(f"{gpus} GPUs are not divisible by tp {tp} x pp {pp} x cp {cp} = {tp * pp * cp}")
    dp = gpus // (tp * pp * cp)
    if global_batch % (dp * mbs):
        raise LayoutError(f"global batch {global_batch} is not divisible by dp {dp} x mbs {mbs} = {dp * mbs}")
    num_microbatches = global_batch // (dp * mbs)
    schedule = schedule or ("interleaved_1f1b" if vpp > 1 else "1f1b")
    if segments is None:
        segments = default_segments(schedule)
    check_shape(schedule, pp, num_microbatches, vpp, segments)
    if stage_layers is None:
        cuts = even_stage_layers(spec.num_layers, pp, vpp, schedule)
    else:
        cuts = stage_layers_from_counts(list(stage_layers), spec.num_layers, pp, vpp, schedule)
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        vpp=vpp,
        mbs=mbs,
        num_microbatches=num_microbatches,
        schedule=schedule,
        recompute=parse_recompute(recompute, pp),
        sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel and tp > 1,
        zero_stage=zero,
        stage_layers=cuts,
        ep=ep,
        etp=etp if spec.is_moe else None,
        segments=segments,
    )


def evaluate_layout(job: Job, layout: Layout) -> Evaluation:
    """`layout` of `job`, checked against it and priced."""
    request = job.request
    check_layout(layout, job.spec, job.cluster, request.global_batch, request.seq)
    return Evaluation(
        job=job, layout=layout, prediction=predict(job.cost_model, layout, request.global_batch, request.seq)
    )


def evaluate(request: Request, **layout_fields: Any) -> PlanFile:
    """The plan file of one fixed layout (`layout_of`'s fields) of `request`, as
    `planner evaluate --json` prints it."""
    job = build(request)
    evaluation = evaluate_layout(job, layout_of(job.spec, request, **layout_fields))
    return plan_document(job, [evaluation.entry()])


def plan(request: Request, space: SearchSpace | None = None, top: int = 5) -> PlanFile:
    """The best `top` plans of `request` over `space` (restricted to what its runtime runs), as
    `planner plan --json` prints them; NoFeasiblePlanError when none fits."""
    from planner.errors import NoFeasiblePlanError
    from planner.search.runtimes import restrict, runtime_check
    from planner.search.search import search

    job = build(request)
    space = space or SearchSpace()
    accept = None
    if request.runtime is not None:
        space = restrict(space, request.runtime)
        accept = runtime_check(
            request.runtime, job.spec, job.cluster, request.global_batch, request.seq, job.cost_model.options
        )
    result = search(job.cost_model, request.global_batch, request.seq, space, top, accept)
    if not result.plans:
        raise NoFeasiblePlanError(
            f"no plan of {job.spec.name} on {request.num_gpus} x {job.cluster.gpu.name} "
            "fits; `planner plan` with the same request says what would"
        )
    entries = [Evaluation(job=job, layout=found.layout, prediction=found.prediction).entry() for found in result.plans]
    return plan_document(job, entries)


def plan_document(job: Job, entries: list[PlanEntry]) -> PlanFile:
    """The plan file of `entries`, with the request that made them and the runtimes each runs on."""
    from planner.search.runtimes import with_runtimes

    cluster = job.cluster
    document = PlanFile(
        plans=entries,
        model=job.spec,
        cluster=ClusterSummary(
            gpu=cluster.gpu.name,
            num_gpus=cluster.num_gpus,
            gpus_per_node=cluster.gpus_per_node,
            memory_limit_gb=round(cluster.memory_limit_bytes / GiB, 3),
            memory_headroom=cluster.memory_headroom,
        ),
        planner_version=__version__,
        cost_source=cost_source_text(job),
        request=job.request,
    )
    return with_runtimes(document)


def cost_source_text(job: Job) -> str:
    """The plan file's `cost_source`: the compute source, and the calibration when one is used."""
    if job.calibration is None:
        return job.cost_model.source.name
    runs = job.calibration.num_runs
    return f"{job.cost_model.source.name}, calibrated from {runs} run{'s' if runs != 1 else ''}"


def document_request(document: PlanFile) -> tuple[Request, list[str]]:
    """The request the plan file answers (converted from the older `inputs` record where the
    file has no `request`), and notes on what could not be recreated."""
    if document.model is None or document.cluster is None:
        raise ConfigError("the plan file has no model or cluster; write it with `planner plan -o`")
    cluster = document.cluster
    notes = []
    global_batch, seq = _batch_of(document)
    if document.request is not None:
        request = document.request
    elif document.inputs is not None:
        old = document.inputs
        given = {
            "attention": old.attention,
            "precision": old.precision,
            "moe_imbalance": old.moe_imbalance,
            "moe_dispatcher": old.moe_dispatcher,
            "moe_ep_overlap": old.moe_ep_overlap,
            "cuda_graphs": old.cuda_graphs,
            "interference": old.interference,
            "stragglers": old.stragglers,
            "speed_spread": old.speed_spread,
        }
        request = Request(
            model=document.model.name,
            gpu=old.gpu,
            num_gpus=old.num_gpus,
            global_batch=global_batch,
            seq=seq,
            gpus_per_node=old.gpus_per_node,
            intra_node_bw_gbps=old.intra_node_bw_gbps,
            inter_node_bw_gbps=old.inter_node_bw_gbps,
            max_memory_gb=old.max_memory_gb,
            runtime=old.runtime,
            options={k: v for k, v in given.items() if v is not None},
            profile=old.profile,
            profile_only=old.profile_only,
            calibration=old.calibration,
        )
    else:
        request = Request(
            model=document.model.name,
            gpu=cluster.gpu,
            num_gpus=cluster.num_gpus,
            gpus_per_node=cluster.gpus_per_node,
            global_batch=global_batch,
            seq=seq,
        )
        notes.append(
            "this plan file predates recorded inputs: re-simulated with the preset's network and "
            "the default cost options"
        )
    if request.profile is not None and not Path(request.profile).exists():
        notes.append(f"the profile {request.profile} is not here: re-simulated with analytic costs")
        request = request.model_copy(update={"profile": None, "profile_only": False})
    return request, notes


def _batch_of(document: PlanFile) -> tuple[int, int]:
    """The global batch and sequence the file's plans answer (a file without a request records
    them in each plan; 1 and 1 for a file without plans)."""
    if not document.plans:
        return 1, 1
    return document.plans[0].global_batch, document.plans[0].seq


def rechecked(document: PlanFile, index: int = 0) -> tuple[PlanFile, list[str]]:
    """The plan file with plan `index` checked against its model, cluster and request and
    priced afresh (LayoutError naming the rule a hand-edited plan breaks), and notes on what
    changed; a file without a cluster is checked against its model only."""
    entry = document.plans[index]
    spec = document.model
    if spec is None or schedule_info(entry.schedule).simulated_only:
        return document, []  # the exporters refuse both, naming why
    check_cuts(entry, spec.num_layers)
    layout = layout_from_entry(entry)
    if document.cluster is None:
        check_tensor_parallel(spec, layout.tp)
        check_expert_parallel(spec, layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp)
        return document, []
    request, notes = document_request(document)
    request = request.model_copy(update={"global_batch": entry.global_batch, "seq": entry.seq})
    job = build(request, spec=spec)
    fresh = evaluate_layout(job, layout).entry().model_copy(update={"cost_sources": entry.cost_sources})
    recorded, now = entry.predicted, fresh.predicted
    if recorded is not None and now is not None and abs(now.step_time_s / recorded.step_time_s - 1) > 1e-6:
        notes.append(
            f"predicted step {recorded.step_time_s:.4g} s in the file, {now.step_time_s:.4g} s now "
            "(the plan was edited or the planner changed): the files carry the fresh figures"
        )
    plans = [fresh if i == index else plan for i, plan in enumerate(document.plans)]
    return document.model_copy(update={"plans": plans}), notes


def check_cuts(entry: PlanEntry, num_layers: int) -> None:
    """LayoutError unless the plan's stage ranges, in model order, tile the model's layers."""
    try:
        ranges = entry.ranges_in_model_order()
    except ValueError as exc:
        raise LayoutError(f"stage_layers: {exc}") from None
    expected = 0
    for start, end in ranges:
        if start != expected or end < start:
            raise LayoutError(
                f"stage_layers: a stage starts at layer {start} where {expected} was expected; the "
                f"stages must cover layers 0..{num_layers} in order"
            )
        expected = end
    if expected != num_layers:
        raise LayoutError(f"stage_layers cover layers 0..{expected}, but the model has {num_layers} layers")
