"""Plans built directly from `PlanEntry` / `PlanFile`, and writing an export to disk."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from planner.catalog import resolve_model
from planner.plan import ClusterSummary, MemoryBreakdown, PlanEntry, PlanFile, Predicted


def predicted(pp: int) -> Predicted:
    """Plausible predicted figures (exporters only copy them into the provenance)."""
    return Predicted(
        step_time_s=1.25,
        tokens_per_s=12345.0,
        mfu=0.41,
        bubble_fraction=0.05,
        memory_gb_per_stage=[10.0 + r for r in range(pp)],
        memory_breakdown_gb=MemoryBreakdown(weights=1, grads=2, optimizer=3, activations=4, other=1),
    )


def make_plan(model: str = "tiny-llama", gpus_per_node: int = 8, **fields) -> PlanFile:
    """A one-plan file for `model`; `fields` override the PlanEntry defaults below
    (pp=2, one micro-batch of one sequence per micro-batch, 4 micro-batches, 1F1B)."""
    entry = dict(
        tp=1,
        pp=2,
        dp=1,
        mbs=1,
        num_microbatches=4,
        global_batch=4,
        seq=64,
        schedule="1f1b",
        stage_layers=[[0, 2], [2, 4]],
        zero_stage=1,
        dtype="bf16",
    )
    entry.update(fields)
    if "global_batch" not in fields:
        entry["global_batch"] = entry["dp"] * entry["mbs"] * entry["num_microbatches"]
    plan = PlanEntry(**entry, predicted=predicted(entry["pp"]))
    num_gpus = plan.num_gpus
    return PlanFile(
        plans=[plan],
        model=resolve_model(model),
        planner_version="0.1.0",
        cost_source="analytic",
        cluster=ClusterSummary(gpu="h100", num_gpus=num_gpus, gpus_per_node=min(gpus_per_node, num_gpus)),
    )


def write_files(files: dict[str, str], folder: Path) -> Path:
    """Write an exporter's output the way the CLI does; return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def imported(path: Path, name: str, monkeypatch):
    """The exported Python file at `path`, imported as module `name` (for this test only)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module
