"""Fixtures of the profiler tests: single-threaded torch, and one real CPU profile of
tiny-llama measured through the CLI once per session."""

from __future__ import annotations

import pytest

CPU_GRID = ["--tp", "1,2", "--mbs", "1,2", "--seq", "64,128"]


@pytest.fixture(scope="session")
def one_thread():
    """Single-threaded torch for the session, freed memory kept as the profiler keeps it on a
    CPU: timings stay stable on a loaded machine."""
    torch = pytest.importorskip("torch")
    from planner.profile.measure import keep_freed_cpu_memory

    keep_freed_cpu_memory()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def cpu_profile(tmp_path_factory, one_thread):
    """A real fp32 CPU profile of tiny-llama (24 shapes), measured with `planner profile`."""
    from planner.cli.app import run

    path = tmp_path_factory.mktemp("profiles") / "cpu-tiny-llama.json"
    with pytest.raises(SystemExit) as done:
        run(
            [
                "profile",
                "--model",
                "tiny-llama",
                *CPU_GRID,
                "--dtype",
                "fp32",
                "--device",
                "cpu",
                "--warmup",
                "1",
                "--repeats",
                "3",
                "-o",
                str(path),
            ]
        )
        raise SystemExit(0)
    assert done.value.code == 0
    return path
