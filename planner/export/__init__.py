"""Exporters: a plan (from a `PlanFile`) -> the files a training runtime reads.

Each exporter is pure: `export_<runtime>(plan_file, index) -> {file name: content}`, and
raises ExportError, naming the part of the plan, for a plan its runtime cannot run. Only
the CLI writes the files. `refusal` and `runs_on` ask the exporters themselves whether a
plan runs: `planner plan --runtime` and the `runs on` column of every plan use them.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import ExportError
from planner.export.common import Files
from planner.export.deepspeed import export_deepspeed
from planner.export.megatron import export_megatron
from planner.export.torch_pp import export_torch
from planner.export.torchtitan import export_torchtitan
from planner.hints import planner_command
from planner.plan import PlanFile

EXPORTERS: dict[str, Callable[[PlanFile, int], Files]] = {
    "megatron": export_megatron,
    "torchtitan": export_torchtitan,
    "torch": export_torch,
    "deepspeed": export_deepspeed,
}
"""Runtime name (the CLI's --to) -> exporter."""


def export_plan(plan_file: PlanFile, runtime: str, index: int = 0) -> Files:
    """The files of runtime `runtime` for plan `index` of `plan_file`; a refusal also names
    the runtimes that do run the plan as it is."""
    _check_known(runtime)
    try:
        return EXPORTERS[runtime](plan_file, index)
    except ExportError as exc:
        others = [name for name in runs_on(plan_file, index) if name != runtime]
        if not others:
            raise
        raise ExportError(
            f"{exc}; as it is, this plan runs on {', '.join(others)}: {planner_command('export', f'--to {others[0]}')}"
        ) from None


def refusal(plan_file: PlanFile, runtime: str, index: int = 0) -> str | None:
    """Why `runtime`'s exporter refuses plan `index`, or None when it takes it."""
    _check_known(runtime)
    try:
        EXPORTERS[runtime](plan_file, index)
    except ExportError as exc:
        return str(exc)
    return None


def runs_on(plan_file: PlanFile, index: int = 0) -> list[str]:
    """The runtimes whose exporter takes plan `index` of `plan_file` as it is."""
    return [name for name in EXPORTERS if refusal(plan_file, name, index) is None]


def _check_known(runtime: str) -> None:
    if runtime not in EXPORTERS:
        raise ExportError(f"unknown export target '{runtime}': choose one of {', '.join(EXPORTERS)}")


__all__ = [
    "EXPORTERS",
    "Files",
    "export_deepspeed",
    "export_megatron",
    "export_plan",
    "export_torch",
    "export_torchtitan",
    "refusal",
    "runs_on",
]
