"""Options shared by several commands, and building the model, cluster and cost model from them."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.calibration import schema as calibration_schema
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.errors import ConfigError, LayoutError
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
CALIBRATION = typer.Option(None, "--calibration", help="Calibration file from `planner calibrate --from-log`: "
                           "the GPU's efficiencies fitted to your own runs.")


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
    spec: ModelSpec, cluster: Cluster, profile: Path | None, options: CostOptions = CostOptions()
) -> CostModel:
    """The cost model, on the analytic compute model or on a measured profile."""
    source = None
    if profile is not None:
        from planner.profile.lookup import profiled_source

        source = profiled_source(profile, spec, cluster.gpu)
    return CostModel(spec, cluster, options, source)


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
