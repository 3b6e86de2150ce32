"""Exporters: a plan (from a `PlanFile`) -> the files a training runtime reads.

Each exporter is pure: `export_<runtime>(plan_file, index) -> {file name: content}`, and
raises ExportError, naming the part of the plan, for a plan its runtime cannot run. Only
the CLI writes the files.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import ExportError
from planner.export.common import Files
from planner.export.deepspeed import export_deepspeed
from planner.export.megatron import export_megatron
from planner.export.torch_pp import export_torch
from planner.export.torchtitan import export_torchtitan
from planner.plan import PlanFile

EXPORTERS: dict[str, Callable[[PlanFile, int], Files]] = {
    "megatron": export_megatron,
    "torchtitan": export_torchtitan,
    "torch": export_torch,
    "deepspeed": export_deepspeed,
}
"""Runtime name (the CLI's --to) -> exporter."""


def export_plan(plan_file: PlanFile, runtime: str, index: int = 0) -> Files:
    """The files of runtime `runtime` for plan `index` of `plan_file`."""
    if runtime not in EXPORTERS:
        raise ExportError(f"unknown export target '{runtime}': choose one of {', '.join(EXPORTERS)}")
    return EXPORTERS[runtime](plan_file, index)


__all__ = ["EXPORTERS", "Files", "export_deepspeed", "export_megatron", "export_plan", "export_torch",
           "export_torchtitan"]
