"""Shared fixtures: the built-in presets and a small cluster."""

from __future__ import annotations

import pytest

from planner.catalog import gpu_presets, model_presets, resolve_gpu
from planner.spec import Cluster


@pytest.fixture(params=sorted(model_presets()))
def preset(request):
    """Every built-in model, one test each."""
    return model_presets()[request.param]


@pytest.fixture
def h100_node():
    return Cluster.of(resolve_gpu("h100"), 8)


@pytest.fixture(params=sorted(gpu_presets()))
def gpu(request):
    return gpu_presets()[request.param]
