"""A GPU preset's compute rates as their sources measured them: in short bursts on one GPU.

The H100 family's presets divide their burst-timed rates by `sustained_compute` (a saturated
GPU's clock at its power limit, tests/cost/test_sustained_compute.py), which the sources did
not see. Tests that check a rate against its own source take the preset without it."""

from __future__ import annotations

from planner.catalog import resolve_gpu
from planner.spec import GpuSpec


def burst_rates(name: str) -> GpuSpec:
    """Preset `name` at its burst rates: `sustained_compute` 1."""
    gpu = resolve_gpu(name)
    efficiency = gpu.efficiency.model_copy(update={"sustained_compute": 1.0})
    return gpu.model_copy(update={"efficiency": efficiency})
