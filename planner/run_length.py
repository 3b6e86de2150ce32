"""Lists with repeated runs written once with their length, as the plan table shows layer counts
('2,3×26,2') and `--stage-layers` reads them ('2,3x26,2' or '2,3×26,2')."""

from __future__ import annotations

from collections.abc import Sequence

from planner.errors import LayoutError

TIMES = "×"


def run_length(values: Sequence[object], times: str = TIMES) -> str:
    """A list with its runs written once with their length: [2, 3, 3, 3, 2] -> '2,3×3,2'."""
    runs: list[list] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return ",".join(f"{value}{times}{count}" if count > 1 else str(value) for value, count in runs)


def expand_counts(text: str, flag: str) -> list[int]:
    """'2,3x3,2' (or '2,3×3,2', or the plain '2,3,3,3,2') -> [2, 3, 3, 3, 2]; LayoutError naming
    `flag` on anything else."""
    values: list[int] = []
    for item in text.replace(TIMES, "x").split(","):
        value, times, count = item.strip().partition("x")
        try:
            number, repeats = int(value), int(count) if times else 1
        except ValueError:
            raise LayoutError(
                f"{flag} takes comma-separated counts, a run written COUNTxREPEATS (e.g. 2,3x26,2); got '{text}'"
            ) from None
        if number < 0 or repeats < 1:
            raise LayoutError(f"{flag}: counts must not be negative and repeats must be at least 1; got '{text}'")
        values += [number] * repeats
    return values
