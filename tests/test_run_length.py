"""Run-length lists: what the plan table shows and `--stage-layers` reads back."""

from __future__ import annotations

import pytest

from planner.errors import LayoutError
from planner.run_length import expand_counts, run_length


@pytest.mark.parametrize(
    "values",
    [[2, 3, 3, 3, 2], [1], [0, 1, 1, 0], [4, 4, 4, 4], [5, 6, 7], [0] * 3 + [9] * 126 + [2]],
)
def test_written_runs_read_back_as_the_list(values):
    for times in ("×", "x"):
        assert expand_counts(run_length(values, times=times), "--stage-layers") == values


def test_runs_are_written_once_with_their_length():
    assert run_length([2, 3, 3, 3, 2]) == "2,3×3,2"
    assert run_length([0] + [1] * 126 + [0], times="x") == "0,1x126,0"
    assert expand_counts("15, 17", "--stage-layers") == [15, 17]


@pytest.mark.parametrize("text", ["2,,3", "2,3x", "2,3x0", "-1,2", "a", "2x3x4"])
def test_malformed_counts_are_refused_naming_the_flag(text):
    with pytest.raises(LayoutError, match="--stage-layers"):
        expand_counts(text, "--stage-layers")
