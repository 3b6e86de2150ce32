"""`planner profile` (measure layer costs, or collectives under torchrun) and
`planner calibrate` (fit the analytic model's efficiencies to profiles).

torch is imported only inside `profile`, so every other command works without it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from planner.catalog import resolve_gpu
from planner.cli import options as opt
from planner.cli import profile_for_plan as for_plan_mod
from planner.cli.app import app, print_json, stderr, stdout
from planner.cli.calibrate_log import calibrate_from_logs
from planner.cost.calibrate import Calibration, fit, transfer
from planner.cost.shapes import LAYER_KINDS
from planner.errors import PlannerError
from planner.layout import check_tensor_parallel
from planner.output import refuse_existing
from planner.profile import store
from planner.profile.lookup import check_model
from planner.profile.schema import PROFILE_DTYPES, PROFILE_RECOMPUTE_MODES, SCHEMA_VERSION, Profile, shape_keys
from planner.spec import GpuEfficiency, ModelSpec
from planner.units import GiB

if TYPE_CHECKING:
    from planner.profile.measure import Settings


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlannerError(f"{option} takes comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise PlannerError(f"{option} takes positive integers, got '{text}'")
    return sorted(set(values))


def _choices(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        raise PlannerError(f"{option}: unknown '{', '.join(unknown) or text}'; choose from {', '.join(allowed)}")
    return values


def _import_measure():
    try:
        from planner.profile import measure
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] == "torch":
            raise PlannerError("planner profile needs torch: pip install torch (the 'torch' extra)") from None
        raise
    return measure


@app.command("profile")
def profile_command(
    ctx: typer.Context,
    model: str = opt.MODEL,
    output: Path = typer.Option(..., "--output", "-o", help="Profile file (JSON) to write."),
    tp: str | None = typer.Option(
        None, "--tp", help="Tensor-parallel degrees, e.g. 1,2,4,8 (default 1; with --for-plan, as plan: those to try)."
    ),
    mbs: str | None = typer.Option(
        None, "--mbs", help="Micro-batch sizes, e.g. 1,2,4 (default 1; with --for-plan, as plan)."
    ),
    seq: str | None = typer.Option(
        None,
        "--seq",
        help="Sequence lengths, e.g. 2048,4096 (default 2048; with --for-plan, the request's one length).",
    ),
    recompute: str | None = typer.Option(
        None,
        "--recompute",
        help="none and/or full (transformer blocks; default none); with --for-plan, as plan: none,selective,full.",
    ),
    kinds: str = typer.Option(",".join(LAYER_KINDS), "--kinds", help="Layer kinds to measure."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 | fp16 | fp32"),
    device: str | None = typer.Option(None, "--device", help="cuda | cpu (default: cuda when present)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed passes per shape."),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Timed passes per shape (median)."),
    memory_cap_gb: float | None = typer.Option(None, "--memory-cap-gb", help="Memory limit, GiB (OOM above)."),
    resume: bool = typer.Option(False, "--resume", help="Continue FILE: skip the shapes it already has."),
    collectives: bool = typer.Option(False, "--collectives", help="Time the node's collectives instead."),
    max_bytes: int = typer.Option(2**30, "--max-bytes", min=1024, help="Largest collective message (bytes)."),
    nproc: int | None = typer.Option(
        None, "--nproc", min=2, help="Processes for --collectives (default: the GPUs, or 2 on a CPU)."
    ),
    block: str = typer.Option(
        "planner", "--block", help="Whose transformer block to measure: planner | torchtitan | megatron."
    ),
    for_plan: bool = typer.Option(
        False,
        "--for-plan",
        help="Measure the shapes a `plan` request with these "
        "arguments can ask for (--gpus, --global-batch, --seq and plan's restrictions).",
    ),
    gpus: int | None = typer.Option(None, "--gpus", "-n", min=1, help="--for-plan: the request's GPUs."),
    gpu: str = opt.GPU,
    global_batch: int | None = typer.Option(
        None, "--global-batch", "-b", min=1, help="--for-plan: the request's global batch."
    ),
    pp: str | None = opt.PP_LIST,
    cp: str | None = opt.CP_LIST,
    vpp: str | None = opt.VPP_LIST,
    schedules: str | None = opt.SCHEDULE_LIST,
    per_rank: bool = opt.PER_RANK_RECOMPUTE,
    sequence_parallel: bool | None = opt.SEQUENCE_PARALLEL,
    zero: str | None = opt.ZERO_LIST,
    runtime: str | None = opt.RUNTIME,
    gpus_per_node: int | None = opt.GPUS_PER_NODE,
    max_shapes: int | None = typer.Option(
        None,
        "--max-shapes",
        help="--for-plan: measure only the N cheapest shapes (plan --profile calibrates the rest).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="--for-plan: list the shapes and the estimate, measure nothing."
    ),
) -> None:
    """Measure each layer kind's forward, backward-input, backward-weight and full-backward
    time and its memory at tensor-parallel shapes (with --for-plan, the shapes a `plan`
    request can ask for, largest first); or, with --collectives under torchrun, the node's
    all-reduce / all-gather / reduce-scatter / send-recv bandwidth."""
    spec = opt.load_model(model)
    if dtype not in PROFILE_DTYPES:
        raise PlannerError(f"--dtype: unknown '{dtype}'; choose from {', '.join(PROFILE_DTYPES)}")
    if memory_cap_gb is not None and memory_cap_gb <= 0:
        raise PlannerError(f"--memory-cap-gb must be positive, got {memory_cap_gb}")
    selection = None
    if for_plan:
        selection = for_plan_mod.select(
            spec, ctx.params, tuple(_choices(kinds, LAYER_KINDS, "--kinds")), dtype, max_shapes
        )
        if dry_run:
            for_plan_mod.print_dry_run(selection, output, gpu, 2 * (warmup + repeats), device)
            return
    elif given := for_plan_mod.plan_only_options_given(ctx.params):
        raise PlannerError(f"{', '.join(given)}: options of --for-plan (the plan request to profile for)")
    measure = _import_measure()
    settings = measure.Settings(
        device=device or measure.default_device(),
        dtype=dtype,
        warmup=warmup,
        repeats=repeats,
        memory_cap_bytes=round(memory_cap_gb * GiB) if memory_cap_gb is not None else None,
        block=block,
    )
    measure.prepare(settings)
    if collectives:
        _collectives(spec, output, settings, max_bytes, nproc)
        return
    measure.check_block(block, spec, settings.device)
    keys = (
        selection.keys
        if selection
        else _grid_keys(spec, tp or "1", mbs or "1", seq or "2048", kinds, recompute or "none")
    )
    profile = _start(spec, output, settings, resume, measure.environment(settings.device))
    done = {key for key, row in profile.row_map().items() if row.status in ("ok", "oom")}
    pending = [key for key in keys if key not in done]
    store.save(output, profile)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=stderr, transient=False) as progress:
            task = progress.add_task("profiling", total=len(pending))
            for key in pending:
                progress.update(task, description=key.describe())
                profile = profile.with_row(measure.measure_shape(spec, key, settings))
                store.save(output, profile)
                progress.advance(task)
    except KeyboardInterrupt:
        store.save(output, profile)
        raise _interrupted(profile, keys, output) from None
    _summary(profile, keys, len(keys) - len(pending), output)
    if selection:
        for_plan_mod.print_calibration_note(selection)


EXIT_INTERRUPTED = 130
"""The exit status of a run stopped by Ctrl-C (128 + SIGINT), as shells report it."""


def _interrupted(profile: Profile, keys: list, output: Path) -> typer.Exit:
    """Print how many shapes `output` holds and the command (as typed, plus --resume) that measures the rest."""
    rows = profile.row_map()
    measured = sum(1 for key in keys if key in rows and rows[key].status in ("ok", "oom"))
    words = sys.argv[1:] + ([] if "--resume" in sys.argv[1:] else ["--resume"])
    program = [sys.executable, "-m", "planner"] if Path(sys.argv[0]).name == "__main__.py" else ["planner"]
    stderr.print(
        f"interrupted: {measured} of {len(keys)} shapes measured are in {output}; "
        f"resume with: {shlex.join(program + words)}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return typer.Exit(EXIT_INTERRUPTED)


def _grid_keys(spec: ModelSpec, tp: str, mbs: str, seq: str, kinds: str, recompute: str) -> list:
    """The shapes of the --tp x --mbs x --seq x --kinds x --recompute grid."""
    tps, mbss, seqs = _ints(tp, "--tp"), _ints(mbs, "--mbs"), _ints(seq, "--seq")
    for degree in tps:
        check_tensor_parallel(spec, degree)
    if spec.position_embedding == "learned" and max(seqs) > spec.max_position_embeddings:
        raise PlannerError(
            f"--seq {max(seqs)} exceeds the {spec.max_position_embeddings} learned positions of {spec.name}"
        )
    return shape_keys(
        _choices(kinds, LAYER_KINDS, "--kinds"),
        tps,
        mbss,
        seqs,
        _choices(recompute, PROFILE_RECOMPUTE_MODES, "--recompute"),
    )


def _start(spec: ModelSpec, output: Path, settings: Settings, resume: bool, env: dict) -> Profile:
    """The profile to add rows to: the file's when resuming, else a new one."""
    if not resume:
        refuse_existing(output, hint="pass --resume to continue it, or choose another -o")
        return Profile(
            schema_version=SCHEMA_VERSION,
            dtype=settings.dtype,
            warmup=settings.warmup,
            repeats=settings.repeats,
            memory_cap_bytes=settings.memory_cap_bytes,
            model=spec,
            block=settings.block,
            **env,
        )
    if not output.exists():
        raise PlannerError(f"--resume: {output} does not exist")
    profile = store.load(output)
    check_model(profile, spec, f"profile {output.name}")
    ours = {
        "device": env["device"],
        "dtype": settings.dtype,
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "memory_cap_bytes": settings.memory_cap_bytes,
        "block": settings.block,
    }
    for name, value in ours.items():
        if getattr(profile, name) != value:
            raise PlannerError(
                f"--resume: {output} has {name} {getattr(profile, name)!r}, this run {value!r}; "
                "resume with the options of the first run"
            )
    return profile


def _summary(profile: Profile, keys: list, skipped: int, output: Path) -> None:
    rows = profile.row_map()
    table = Table(
        title=f"{profile.model.name} ({profile.block} block) on {profile.device}, {profile.dtype}: "
        "ms and MiB per micro-batch"
    )
    for column in ("kind", "tp", "mbs", "seq", "rc", "status", "fwd", "I", "W", "bwd", "(I+W)/bwd", "saved"):
        table.add_column(column, justify="left" if column in ("kind", "rc", "status") else "right")
    counts: dict[str, int] = {}
    for key in keys:
        row = rows[key]
        counts[row.status] = counts.get(row.status, 0) + 1
        shape = (key.kind, str(key.tp), str(key.mbs), str(key.seq), key.recompute, row.status)
        if row.status != "ok":
            table.add_row(*shape, row.message, "", "", "", "", "")
            continue
        split = row.backward_input_ms + row.backward_weight_ms
        table.add_row(
            *shape,
            f"{row.forward_ms:.3f}",
            f"{row.backward_input_ms:.3f}",
            f"{row.backward_weight_ms:.3f}",
            f"{row.backward_ms:.3f}",
            f"{split / row.backward_ms:.2f}" if row.backward_ms else "-",
            f"{row.activation_bytes / 2**20:.2f}",
        )
    stdout.print(table)
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    stdout.print(f"{len(keys)} shapes ({status}); {skipped} were already in {output}; wrote {output}")


def _default_nproc(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return 2


def _collectives(spec: ModelSpec, output: Path, settings: Settings, max_bytes: int, nproc: int | None) -> None:
    """Time the collectives across torchrun's ranks when launched under it, else across
    `nproc` processes spawned here; rank 0 adds the rows to `output`."""
    from planner.profile import collectives

    sizes = collectives.message_sizes(max_bytes)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        if nproc is not None and nproc != world:
            raise PlannerError(f"--nproc {nproc}: this torchrun launch has {world} processes")
        rows = collectives.run(sizes, settings.device, settings.warmup, settings.repeats)
    else:
        world = nproc or _default_nproc(settings.device)
        if world < 2:
            raise PlannerError("--collectives needs at least 2 GPUs (or --device cpu --nproc N)")
        rows = collectives.spawn(world, sizes, settings.device, settings.warmup, settings.repeats)
    if not rows:  # ranks other than 0 write nothing
        return
    measure = _import_measure()
    env = measure.environment(settings.device)
    if output.exists():
        profile = store.load(output)
        check_model(profile, spec, f"profile {output.name}")
    else:
        profile = Profile(
            schema_version=SCHEMA_VERSION,
            dtype=settings.dtype,
            warmup=settings.warmup,
            repeats=settings.repeats,
            model=spec,
            **env,
        )
    store.save(output, profile.with_collectives(rows))
    table = Table(title=f"collectives over {world} ranks ({rows[0].backend}); group = ranks 0..g-1")
    for column in ("op", "g", "bytes", "time us", "algbw GB/s", "busbw GB/s"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for r in rows:
        table.add_row(
            r.op, str(r.world_size), f"{r.bytes}", f"{r.time_us:.1f}", f"{r.algbw_gbps:.2f}", f"{r.busbw_gbps:.2f}"
        )
    stdout.print(table)
    stdout.print(f"wrote {len(rows)} collective rows to {output}")


@app.command("calibrate")
def calibrate_command(
    profiles: list[Path] | None = typer.Argument(None, help="Profile files measured on one device."),
    gpu: str = opt.GPU,
    to: str | None = typer.Option(None, "--to", help="Also transfer the fit to this GPU preset."),
    as_json: bool = opt.JSON,
    from_log: list[Path] | None = typer.Option(
        None,
        "--from-log",
        help="A Megatron-LM or torchtitan training log (repeat, one per --plan) to fit the GPU's efficiencies to.",
    ),
    plan: list[Path] | None = typer.Option(
        None,
        "--plan",
        help="The plan file (`planner plan/evaluate -o`) of the layout the matching --from-log ran (its first plan).",
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="With --from-log: calibration file to write."),
    force: bool = opt.FORCE,
    skip_steps: int | None = typer.Option(
        None,
        "--skip-steps",
        min=0,
        help="With --from-log: ignore progress reports up to this step as warm-up (default: the first report).",
    ),
) -> None:
    """Fit the analytic model's efficiencies (gemm, gemm_half_dim, attention_fwd,
    attention_bwd, hbm, kernel_overhead_us) to measured profiles; print the TOML table for
    presets/gpus.toml and the error before and after. With --from-log LOG --plan PLAN: fit
    the GPU's compute / communication / overhead knobs to your own runs' step times and
    write a calibration file for plan / evaluate / sweep --calibration."""
    if from_log or plan:
        if profiles:
            raise PlannerError("give profile files or --from-log/--plan, not both")
        refuse_existing(output, force=force)
        calibrate_from_logs(from_log or [], plan or [], output, skip_steps, as_json)
        return
    if not profiles:
        raise PlannerError("calibrate needs profile files, or --from-log LOG --plan PLAN")
    spec = resolve_gpu(gpu)
    loaded = [store.load(path) for path in profiles]
    names = ", ".join(path.name for path in profiles)
    result = fit(loaded, spec)
    source = (
        f"fitted by planner calibrate to {names} ({result.num_samples} times; mean abs error "
        f"{result.before_pct:.1f}% -> {result.after_pct:.1f}%)"
    )
    efficiency = result.efficiency.model_copy(update={"source": source})
    target = resolve_gpu(to) if to else None
    moved = (
        transfer(efficiency, target, f"{spec.name} fit transferred as fractions of peak: {source}") if target else None
    )
    note = (
        "Efficiencies are fractions of datasheet peak: they transfer to another GPU unchanged "
        "(--to GPU), whose times then scale with its own peak FLOP/s and HBM bandwidth."
    )
    if as_json:
        print_json(
            json.dumps(
                {
                    "gpu": spec.name,
                    "profiles": [str(p) for p in profiles],
                    "efficiency": efficiency.model_dump(),
                    "error_before_pct": result.before_pct,
                    "error_after_pct": result.after_pct,
                    "num_samples": result.num_samples,
                    "parts": [
                        {
                            "kind": p.kind,
                            "part": p.part,
                            "count": p.count,
                            "before_pct": p.before_pct,
                            "after_pct": p.after_pct,
                        }
                        for p in result.parts
                    ],
                    "transferred": {"gpu": target.name, "efficiency": moved.model_dump()} if target else None,
                    "note": note,
                },
                indent=2,
            )
        )
        return
    stdout.print(_error_table(result, spec.name))
    stdout.print(_toml(spec.name, efficiency), markup=False, highlight=False)
    if target:
        stdout.print(_toml(target.name, moved), markup=False, highlight=False)
    stdout.print(note, markup=False)


def _error_table(result: Calibration, gpu: str) -> Table:
    table = Table(title=f"analytic model vs measured ({gpu} efficiencies): mean absolute error, %")
    for column in ("kind", "part", "times", "before", "after"):
        table.add_column(column, justify="left" if column in ("kind", "part") else "right")
    for p in result.parts:
        table.add_row(p.kind, p.part, str(p.count), f"{p.before_pct:.1f}", f"{p.after_pct:.1f}")
    table.add_row("all", "", str(result.num_samples), f"{result.before_pct:.1f}", f"{result.after_pct:.1f}")
    return table


def _toml(gpu: str, efficiency: GpuEfficiency) -> str:
    lines = [f"[{gpu}.efficiency]"]
    for name, value in efficiency.model_dump().items():
        if value is None:  # TOML has no null: an absent key is the field's default, None
            continue
        lines.append(f"{name} = {json.dumps(value) if isinstance(value, str) else f'{value:.4g}'}")
    return "\n".join(lines) + "\n"
