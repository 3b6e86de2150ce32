"""Shared fixtures: the built-in presets and a small cluster."""

from __future__ import annotations

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
