"""`planner models` and `planner gpus`: what is built in."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from planner.catalog import gpu_presets, model_presets
from planner.cli.app import app, print_json, stdout
from planner.cost.memory import active_param_count, total_param_count


@app.command("models")
def models_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the built-in models."""
    rows = []
    for name, spec in model_presets().items():
        rows.append(
            {
                "name": name,
                "family": spec.family,
                "params_b": round(total_param_count(spec) / 1e9, 3),
                "active_params_b": round(active_param_count(spec) / 1e9, 3),
                "layers": spec.num_layers,
                "hidden": spec.hidden_size,
                "heads": spec.num_attention_heads,
                "kv_heads": spec.num_kv_heads,
                "ffn": spec.ffn_hidden_size,
                "vocab": spec.vocab_size,
                "experts": spec.num_experts,
                "top_k": spec.moe_top_k,
                "source": spec.source,
            }
        )
    if as_json:
        print_json(json.dumps({"models": rows}, indent=2))
        return
    table = Table(title="Built-in models (--model NAME, or a path to a config.json)")
    for column in ("name", "family", "params", "active", "layers", "hidden", "heads", "kv", "ffn", "vocab", "MoE"):
        table.add_column(column, justify="left" if column in ("name", "family") else "right")
    for r in rows:
        moe = f"top-{r['top_k']} of {r['experts']}" if r["experts"] else "-"
        table.add_row(
            r["name"],
            r["family"],
            f"{r['params_b']:.2f}B",
            f"{r['active_params_b']:.2f}B",
            str(r["layers"]),
            str(r["hidden"]),
            str(r["heads"]),
            str(r["kv_heads"]),
            str(r["ffn"]),
            str(r["vocab"]),
            moe,
        )
    stdout.print(table)


@app.command("gpus")
def gpus_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the built-in GPUs with their datasheet numbers."""
    presets = gpu_presets()
    if as_json:
        print_json(json.dumps({"gpus": [g.model_dump() for g in presets.values()]}, indent=2))
        return
    table = Table(title="Built-in GPUs (--gpu NAME); dense peak, usable memory, links per GPU")
    for column in (
        "name",
        "description",
        "bf16 TFLOP/s",
        "memory GiB",
        "HBM GB/s",
        "GPUs/node",
        "intra GB/s",
        "inter GB/s",
    ):
        table.add_column(column, justify="left" if column in ("name", "description") else "right")
    for g in presets.values():
        table.add_row(
            g.name,
            g.description,
            f"{g.peak_tflops['bf16']:.0f}",
            f"{g.memory_gib:.1f}",
            f"{g.hbm_bw_gbps:.0f}",
            str(g.gpus_per_node),
            f"{g.intra_node_bw_gbps:.0f}",
            f"{g.inter_node_bw_gbps:.0f}",
        )
    stdout.print(table)
