"""Validate the planner on one node: profile it, plan for it, run the plan, compare.

    python -m planner.fidelity.validate_node --model llama3-8b --nproc 8 --device cuda \\
        --global-batch 64 --seq 4096 [--steps 10] [--gpu h100] [--workdir validate-node]
    scripts/validate_node.sh ...       (the same, from a shell)

Five steps, each a planner command a user could run by hand (printed as it runs):

1. `planner profile` the model's layers at every TP degree up to the node and the given
   micro-batch sizes, and the node's collectives (`--collectives`);
2. `planner plan --profile` for this node (`--gpus N --gpus-per-node N --runtime torch`);
3. `planner export --to torch` the best plan;
4. run the exported script for K steps under torchrun (`--report`: per-rank parameters,
   step times, CUDA peak memory);
5. compare per rank, print the table with its legend and write the JSON record.

The comparison (`compare`, `format_report`) is pure; only `run` touches processes and files.
Predicted step time is the plan's; the measured one is each rank's median over steps 2..K
(step 1 builds caches and communicators). Memory: the plan's per-GPU total (GiB; it includes
mixed-precision optimizer state and the fixed allowance for CUDA context and NCCL buffers)
against torch's peak allocated memory on CUDA (not measured on a CPU). Parameters are
compared exactly: the planner's per-rank count, and the count of the layout the torch script
runs (it keeps the embedding and head whole under TP, where Megatron shards the vocabulary).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from planner.catalog import resolve_model
from planner.cost import memory
from planner.plan import PlanEntry, PlanFile, parse_plan_file
from planner.schedule.registry import virtual_stage
from planner.spec import ModelSpec
from planner.units import GiB

LEGEND = """\
How to read this table (one row per process):
  rank           global rank; pp is its pipeline rank (its stage's layers are on the row)
  step s         predicted step time (the plan's) / measured median of steps 2..K on this rank
  err            predicted / measured - 1: within +-15% is good on a GPU node; on a CPU it only
                 checks the flow (the cost model's communication is the GPU preset's)
  params         the planner's parameter count for this rank / what the run holds; 'exact' when
                 equal. Under TP the torch script keeps the embedding and head whole (planner
                 counts a vocabulary shard): 'script layout' then says the run holds exactly
                 the layout the script builds, and the difference is that choice, not an error
  peak GiB       the plan's memory per GPU (weights, grads, optimizer, activations, allowance)
                 / torch.cuda.max_memory_allocated (CUDA only; '-' on a CPU). The plan also
                 counts ~2 GiB of CUDA context and NCCL buffers outside the allocator, so a
                 good result is measured a little under predicted; measured above predicted
                 means the plan would not fit where it says it does"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankComparison:
    """Predicted against measured for one process of the run."""

    rank: int
    pp_rank: int
    layers: str
    predicted_step_s: float
    measured_step_s: float
    planner_params: int
    script_params: int
    measured_params: int
    predicted_peak_gib: float
    measured_peak_gib: float | None

    @property
    def step_error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_step_s / self.measured_step_s - 1.0


def rank_params(spec: ModelSpec, entry: PlanEntry, pp_rank: int, vocab_parallel: bool = True) -> int:
    """Parameters on one GPU of pipeline rank `pp_rank`: its layers' TP shards, plus the
    embedding where the first virtual stage is and the head where the last is (a vocabulary
    shard each with `vocab_parallel`, as the planner's memory model counts; whole, as the
    torch script keeps them, without)."""
    vocab_tp = entry.tp if vocab_parallel else 1
    num_stages = entry.pp * entry.vpp
    chunks = entry.chunks_of(pp_rank)
    stages = {virtual_stage(pp_rank, chunk, entry.pp, entry.schedule) for chunk in range(len(chunks))}
    layers = sum(end - start for start, end in chunks)
    params = layers * memory.transformer_param_count(spec, entry.tp)
    first, last = 0 in stages, num_stages - 1 in stages
    if first:
        params += memory.embedding_param_count(spec, vocab_tp)
    if last:
        params += memory.head_param_count(spec, vocab_tp, shares_rank_with_embedding=first)
    return round(params)


def compare(plan_file: PlanFile, reports: list[dict]) -> list[RankComparison]:
    """One comparison per rank report (`train_pipeline.py --report`), by global rank."""
    entry, spec = plan_file.plans[0], plan_file.model
    rows = []
    for report in sorted(reports, key=lambda r: r["rank"]):
        pp_rank = report["pp_rank"]
        steps = report["step_time_s"][1:] or report["step_time_s"]
        peak = report.get("peak_allocated_bytes")
        rows.append(
            RankComparison(
                rank=report["rank"],
                pp_rank=pp_rank,
                layers=" ".join(f"{a}-{b}" for a, b in entry.chunks_of(pp_rank)),
                predicted_step_s=entry.predicted.step_time_s,
                measured_step_s=statistics.median(steps),
                planner_params=rank_params(spec, entry, pp_rank),
                script_params=rank_params(spec, entry, pp_rank, vocab_parallel=False),
                measured_params=report["params"],
                predicted_peak_gib=entry.predicted.memory_gb_per_stage[pp_rank],
                measured_peak_gib=None if peak is None else peak / GiB,
            )
        )
    return rows


def format_report(plan_file: PlanFile, rows: list[RankComparison]) -> str:
    """The comparison table, the plan it ran and the legend, as text."""
    entry = plan_file.plans[0]
    head = (
        f"plan: tp={entry.tp} pp={entry.pp} dp={entry.dp} vpp={entry.vpp} mbs={entry.mbs} "
        f"M={entry.num_microbatches} schedule={entry.schedule} recompute={entry.recompute} "
        f"({plan_file.cost_source})"
    )
    lines = [
        head,
        f"{'rank':>4} {'pp':>3} {'layers':<10} {'step s pred/meas':>20} {'err':>7} "
        f"{'params pred/run':>24} {'':<13} {'peak GiB pred/meas':>19}",
    ]
    for r in rows:
        if r.measured_params == r.planner_params:
            verdict = "exact"
        elif r.measured_params == r.script_params:
            verdict = "script layout"
        else:
            verdict = "DIFFERENT"
        measured_peak = "-" if r.measured_peak_gib is None else f"{r.measured_peak_gib:.2f}"
        lines.append(
            f"{r.rank:>4} {r.pp_rank:>3} {r.layers:<10} {r.predicted_step_s:>9.4f} / {r.measured_step_s:<8.4f} "
            f"{100 * r.step_error:>+6.1f}% {r.planner_params:>11} / {r.measured_params:<10} {verdict:<13} "
            f"{r.predicted_peak_gib:>8.2f} / {measured_peak:<8}"
        )
    return "\n".join([*lines, "", LEGEND])


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRequest:
    """What to validate: the model, the node (processes, device, GPU preset), the batch."""

    model: str
    nproc: int
    global_batch: int
    seq: int
    device: str = "cpu"
    gpu: str = "h100"
    steps: int = 5
    mbs: str = "1,2"
    dtype: str = "bf16"
    warmup: int = 2
    repeats: int = 5
    max_collective_bytes: int = 2**30
    plan_args: tuple[str, ...] = ()
    workdir: Path = Path("validate-node")


def tp_degrees(spec: ModelSpec, nproc: int) -> list[int]:
    """TP degrees up to the node that divide the model's heads and the node."""
    return [
        t
        for t in range(1, nproc + 1)
        if nproc % t == 0 and spec.num_attention_heads % t == 0 and spec.num_kv_heads % t == 0
    ]


def commands(request: NodeRequest) -> dict[str, list[str]]:
    """The planner commands of steps 1 to 4, in order."""
    spec = resolve_model(request.model)
    work, py = request.workdir, sys.executable
    profile, plan, export = work / "profile.json", work / "plan.json", work / "torch"
    n = str(request.nproc)
    common = [
        "--model",
        request.model,
        "--device",
        request.device,
        "--dtype",
        request.dtype,
        "--warmup",
        str(request.warmup),
        "--repeats",
        str(request.repeats),
    ]
    tps = ",".join(map(str, tp_degrees(spec, request.nproc)))
    return {
        "profile layers": [
            py,
            "-m",
            "planner",
            "profile",
            *common,
            "--tp",
            tps,
            "--mbs",
            request.mbs,
            "--seq",
            str(request.seq),
            "--recompute",
            "none,full",
            "-o",
            str(profile),
        ],
        "profile collectives": [
            py,
            "-m",
            "planner",
            "profile",
            "--collectives",
            *common,
            "--nproc",
            n,
            "--max-bytes",
            str(request.max_collective_bytes),
            "-o",
            str(profile),
        ],
        "plan": [
            py,
            "-m",
            "planner",
            "plan",
            "--model",
            request.model,
            "--gpus",
            n,
            "--gpus-per-node",
            n,
            "--gpu",
            request.gpu,
            "--global-batch",
            str(request.global_batch),
            "--seq",
            str(request.seq),
            "--tp",
            tps,
            "--mbs",
            request.mbs,
            "--runtime",
            "torch",
            "--profile",
            str(profile),
            *request.plan_args,
            "--json",
            "-o",
            str(plan),
            "--force",
        ],
        "export": [py, "-m", "planner", "export", str(plan), "--to", "torch", "-o", str(export), "--force"],
        "run": [
            py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            n,
            str(export / "train_pipeline.py"),
            "--device",
            request.device,
            "--dtype",
            request.dtype,
            "--steps",
            str(request.steps),
            "--report",
            str(work / "report"),
        ],
    }


def run(request: NodeRequest, echo=print) -> dict:
    """Steps 1-5; returns the JSON record (also written to WORKDIR/validate_node.json)."""
    request.workdir.mkdir(parents=True, exist_ok=True)
    for stale in [request.workdir / "profile.json", *request.workdir.glob("report.rank*.json")]:
        stale.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for name, argv in commands(request).items():
        echo(f"== {name}: {shlex.join(argv)}")
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    plan_file = parse_plan_file((request.workdir / "plan.json").read_text())
    reports = [json.loads(p.read_text()) for p in sorted(request.workdir.glob("report.rank*.json"))]
    rows = compare(plan_file, reports)
    echo(format_report(plan_file, rows))
    record = {
        "request": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(request).items()},
        "plan": plan_file.plans[0].model_dump(mode="json"),
        "cost_source": plan_file.cost_source,
        "ranks": [{**asdict(r), "step_error": r.step_error} for r in rows],
        "commands": {name: shlex.join(argv) for name, argv in commands(request).items()},
    }
    (request.workdir / "validate_node.json").write_text(json.dumps(record, indent=1) + "\n")
    echo(f"wrote {request.workdir / 'validate_node.json'}")
    return record


def main(argv: list[str] | None = None) -> None:
    """Command line of `scripts/validate_node.sh`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="preset name or config.json")
    parser.add_argument("--nproc", type=int, required=True, help="GPUs on the node (or CPU processes)")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--gpu", default="h100", help="GPU preset the plan is for")
    parser.add_argument("--steps", type=int, default=10, help="training steps to run (K)")
    parser.add_argument("--mbs", default="1,2", help="micro-batch sizes to profile and search")
    parser.add_argument("--dtype", default=None, help="bf16 on cuda, fp32 on cpu by default")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--max-collective-bytes",
        type=int,
        default=None,
        help="largest collective message (default 1 GiB on cuda, 16 MiB on cpu)",
    )
    parser.add_argument("--workdir", type=Path, default=Path("validate-node"))
    parser.add_argument("plan_args", nargs="*", help="after --: more `planner plan` options")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    request = NodeRequest(
        model=args.model,
        nproc=args.nproc,
        global_batch=args.global_batch,
        seq=args.seq,
        device=args.device,
        gpu=args.gpu,
        steps=args.steps,
        mbs=args.mbs,
        dtype=args.dtype or ("bf16" if cuda else "fp32"),
        warmup=args.warmup,
        repeats=args.repeats,
        workdir=args.workdir,
        plan_args=tuple(args.plan_args),
        max_collective_bytes=args.max_collective_bytes or (2**30 if cuda else 16 * 2**20),
    )
    try:
        run(request)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
