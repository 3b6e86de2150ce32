"""Options shared by several commands, and building the model, cluster and cost model from them."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.errors import LayoutError
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
PROFILE = typer.Option(None, "--profile", help="Measured profile (JSON) to use instead of the analytic compute model.")
JSON = typer.Option(False, "--json", help="Print the JSON contract instead of tables.")
OUT = typer.Option(None, "--out", "-o", help="Also write the plan file for `planner export`.")
# Attention kernel, CUDA graphs and overlap interference (issue 12, points 2-4).
ATTENTION = typer.Option(None, "--attention", help="Attention kernel: flash2, flash3, cudnn or unfused "
                         "(default: the runtime's on this GPU: Megatron-LM cudnn on Hopper, else flash2).")
CUDA_GRAPHS = typer.Option(False, "--cuda-graphs", help="The runtime replays CUDA graphs: no host "
                           "launch time per kernel.")
INTERFERENCE = typer.Option(True, "--interference/--no-interference", help="Charge the slowdown that "
                            "communication overlapped with compute causes in it.")


def check_attention(attention: str | None) -> str | None:
    """The --attention value, refused with the choices when unknown."""
    from planner.cost.compute import ATTENTION_IMPLS

    if attention is not None and attention not in ATTENTION_IMPLS:
        raise LayoutError(f"unknown attention kernel '{attention}': choose {', '.join(ATTENTION_IMPLS)}")
    return attention


def build_cluster(
    gpu: str,
    num_gpus: int,
    gpus_per_node: int | None = None,
    intra_node_bw: float | None = None,
    inter_node_bw: float | None = None,
    max_memory_gb: float | None = None,
) -> Cluster:
    """A Cluster of `num_gpus` preset GPUs with the given overrides."""
    return Cluster.of(
        resolve_gpu(gpu),
        num_gpus,
        gpus_per_node=gpus_per_node,
        intra_node_bw_gbps=intra_node_bw,
        inter_node_bw_gbps=inter_node_bw,
        memory_limit_gib=max_memory_gb,
    )


def build_cost_model(
    spec: ModelSpec, cluster: Cluster, profile: Path | None, options: CostOptions = CostOptions()
) -> CostModel:
    """The cost model, on the analytic compute model or on a measured profile."""
    source = None
    if profile is not None:
        from planner.profile.lookup import profiled_source

        source = profiled_source(profile, spec, cluster.gpu)
    return CostModel(spec, cluster, options, source)


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
