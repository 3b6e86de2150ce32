"""Fixtures of the exporter tests."""

from __future__ import annotations

from pathlib import Path

import pytest

SHM = Path("/dev/shm")


@pytest.fixture(autouse=True)
def no_leaked_deepspeed_buffers():
    """Removes the shared-memory buffers DeepSpeed's CPU all-reduce leaves behind in /dev/shm
    (about 66 MB per rank and run) that the test created."""
    pattern = "deepspeed_allreduce_buffer_*"
    before = set(SHM.glob(pattern))
    yield
    for leaked in set(SHM.glob(pattern)) - before:
        leaked.unlink(missing_ok=True)
