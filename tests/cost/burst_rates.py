"""A GPU preset's compute rates as their sources measured them: in short bursts on one GPU.

The H100 family's presets multiply their measured rates by two factors a training run sees and
the sources did not: `layer_scale` (the one block measured on an H100 against these rates,
tests/cost/test_layer_scale.py) and `sustained_compute` (a saturated GPU's clock at its power
limit, tests/cost/test_sustained_compute.py). Tests that check a rate against its own source
take the preset without them."""

from __future__ import annotations

from planner.catalog import resolve_gpu
from planner.spec import GpuSpec


def burst_rates(name: str, *, layer_scale: float = 1.0) -> GpuSpec:
    """Preset `name` at its burst rates: `sustained_compute` 1 and `layer_scale` as given
    (1 by default: the component rates alone)."""
    gpu = resolve_gpu(name)
    update = {"layer_scale": layer_scale, "sustained_compute": 1.0}
    return gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update=update)})
