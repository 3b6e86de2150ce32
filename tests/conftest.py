"""Shared fixtures: the built-in presets and a small cluster."""

from __future__ import annotations

import sys

import pytest

from planner.catalog import gpu_presets, model_presets, resolve_gpu
from planner.cli import run
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


@pytest.fixture
def cli(capsys):
    """Run `planner ARGV...` in this process; returns (exit code, stdout, stderr)."""

    def invoke(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exit_info:
            run(list(argv))
            raise SystemExit(0)
        out, err = capsys.readouterr()
        return exit_info.value.code, out, err

    return invoke


@pytest.fixture(autouse=True, scope="module")
def _no_process_group_outlives_its_module():
    """Tear down a default process group (and megatron-core's model-parallel state over it) that
    a module's tests left behind, e.g. the megatron profile block's one-process group, so a later
    module can start its own (torch's fake world) in any test order."""
    yield
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return
    parallel_state = sys.modules.get("megatron.core.parallel_state")
    if parallel_state is not None:
        parallel_state.destroy_model_parallel()
    distributed.destroy_process_group()
