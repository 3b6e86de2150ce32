"""`planner cost`: per-layer costs at one shape."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from planner.cli import options as opt
from planner.cli.app import app, print_json, stdout
from planner.cost.model import DENSE_BLOCK
from planner.cost.shapes import LAYER_KINDS, Shard
from planner.errors import LayoutError
from planner.job import build
from planner.layout import check_expert_parallel, check_tensor_parallel
from planner.plan import RECOMPUTE_MODES
from planner.predict import combined_1f1b_runs
from planner.spec import GpuEfficiency


@app.command("cost")
def cost_command(
    model: str = opt.MODEL,
    gpu: str = opt.GPU,
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
    cp: int = typer.Option(1, "--cp", min=1, help="Context-parallel degree."),
    mbs: int = typer.Option(1, "--mbs", min=1, help="Micro-batch size, sequences."),
    seq: int = opt.SEQ,
    sequence_parallel: bool = typer.Option(False, "--sp/--no-sp", help="Sequence parallelism (with TP)."),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    ep: int = opt.EP,
    etp: int | None = opt.ETP,
    precision: str | None = opt.PRECISION,
    moe_imbalance: float | None = opt.MOE_IMBALANCE,
    moe_dispatcher: str | None = opt.MOE_DISPATCHER,
    moe_ep_overlap: bool | None = opt.MOE_EP_OVERLAP,
    profile: Path | None = opt.PROFILE,
    attention: str | None = opt.ATTENTION,
    cuda_graphs: bool | None = opt.CUDA_GRAPHS,
    runtime: str | None = opt.RUNTIME,
    sets: list[str] | None = opt.SET,
    as_json: bool = opt.JSON,
) -> None:
    """Per-layer forward / backward (input, weight) time, TP communication, activation
    memory and parameters of each layer kind, for one micro-batch on one GPU."""
    if recompute not in RECOMPUTE_MODES:
        raise LayoutError(f"unknown recompute mode '{recompute}': choose {', '.join(RECOMPUTE_MODES)}")
    spec = opt.load_model(model)
    check_tensor_parallel(spec, tp)
    if seq % cp:
        raise LayoutError(f"sequence length {seq} is not divisible by cp {cp}")
    expert_tp = (etp or tp) if spec.is_moe else tp
    dp = max(1, ep * expert_tp // (tp * cp))  # the fewest data-parallel ranks the expert degrees fold over
    check_expert_parallel(spec, tp, cp, dp, ep, expert_tp)
    job = build(
        opt.request_of(
            model,
            tp * cp * dp,
            gpu,
            runtime=runtime,
            attention=attention,
            precision=precision,
            moe_imbalance=moe_imbalance,
            moe_dispatcher=moe_dispatcher,
            moe_ep_overlap=moe_ep_overlap,
            cuda_graphs=cuda_graphs,
            sets=sets,
            profile=profile,
        ),
        spec,
    )
    cluster, cost_model = job.cluster, job.cost_model
    options = cost_model.options
    shard = Shard(
        mbs=mbs,
        seq=seq,
        tp=tp,
        cp=cp,
        sequence_parallel=sequence_parallel and tp > 1,
        ep=ep,
        etp=etp if spec.is_moe else None,
    )
    # Megatron's combined 1F1B pairs the MoE blocks' passes where it runs (one micro-batch, no pipeline)
    paired = combined_1f1b_runs(options, spec, "1f1b", 1, ep, (recompute,))
    layers = {}
    # an MoE model's dense-MLP blocks and multi-token-prediction modules, where it has them
    extra_kinds = ((DENSE_BLOCK,) if cost_model.dense_block is not None else ()) + (("mtp",) if spec.mtp_depth else ())
    for kind in (*LAYER_KINDS, *extra_kinds):
        c = cost_model.layer_costs(kind, shard, recompute, paired and kind in ("transformer", "mtp"))
        layers[kind] = {
            "forward_ms": c.forward_s * 1e3,
            "backward_ms": c.backward_s * 1e3,
            "backward_input_ms": c.backward_input_s * 1e3,
            "backward_weight_ms": c.backward_weight_s * 1e3,
            "comm_ms": (c.comm_forward_s + c.comm_backward_s) * 1e3,
            "moe_all_to_all_ms": c.moe_comm_s * 1e3,
            "recompute_ms": c.recompute_s * 1e3,
            "activation_bytes": round(c.activation_bytes),
            "param_count": round(c.param_count),
        }
    if as_json:
        print_json(
            json.dumps(
                {
                    "model": spec.name,
                    "gpu": cluster.gpu.name,
                    "cost_source": cost_model.source.name,
                    "efficiency_source": cluster.gpu.efficiency.source,
                    "shape": {
                        "tp": tp,
                        "cp": cp,
                        "mbs": mbs,
                        "seq": seq,
                        "sequence_parallel": shard.sequence_parallel,
                        "recompute": recompute,
                    },
                    "attention": options.kernels.attention,
                    "cuda_graphs": options.kernels.cuda_graphs,
                    "ep": ep,
                    "etp": shard.etp,
                    "precision": options.kernels.precision,
                    "moe_dispatcher": options.moe.moe_dispatcher if spec.is_moe and ep > 1 else "alltoall",
                    "moe_ep_overlap": bool(paired),
                    "runtime": runtime,
                    "layers": layers,
                },
                indent=2,
            )
        )
        return
    as_run = f", as {runtime} runs it" if runtime else ""
    table = Table(
        title=f"{spec.name} on {cluster.gpu.name}: one micro-batch, tp={tp} cp={cp} "
        f"mbs={mbs} seq={seq} ({cost_model.source.name} costs, {options.kernels.attention} attention{as_run})"
    )
    columns = ("layer", "fwd ms", "bwd ms", "bwd-input ms", "bwd-weight ms", "comm ms", "activations MiB", "params (M)")
    for column in columns:
        table.add_column(column, justify="left" if column == "layer" else "right")
    for kind, c in layers.items():
        table.add_row(
            kind,
            f"{c['forward_ms']:.3f}",
            f"{c['backward_ms']:.3f}",
            f"{c['backward_input_ms']:.3f}",
            f"{c['backward_weight_ms']:.3f}",
            f"{c['comm_ms']:.3f}",
            f"{c['activation_bytes'] / 2**20:.1f}",
            f"{c['param_count'] / 1e6:.2f}",
        )
    stdout.print(table)
    if cost_model.source.name == "analytic":
        stdout.print(
            f"compute efficiencies of {cluster.gpu.name}: {cluster.gpu.efficiency.source}",
            markup=False,
            highlight=False,
        )
        anchors = rate_anchors(cluster.gpu.efficiency)
        if anchors:
            stdout.print(anchors, markup=False, highlight=False)


def rate_anchors(eff: GpuEfficiency) -> str:
    """One line naming the factor on a GPU's burst-timed rates (its sustained clock), or ""
    when it has none."""
    if eff.sustained_compute == 1.0:
        return ""
    return (
        f"the compute-bound rates x sustained_compute {eff.sustained_compute:g} "
        "(a GPU held at its power limit; docs/h100_rates.md)"
    )
