"""Pipeline actions in torch's vocabulary, their text form (`2F0`) and the per-rank CSV.

An `Action(stage_index, computation_type, microbatch_index)` names one step of one rank:
`2F0` is the forward of global virtual stage 2 on micro-batch 0, `5I3` the input-gradient
backward of stage 5 on micro-batch 3, `1SEND_F4` the send of stage 1's output for
micro-batch 4. The text form and the CSV (one row per rank, comma-separated actions, rank
order = row order) are those of `torch.distributed.pipelining.schedules` (`_Action.__repr__`,
`_Action.from_str`, `_dump_csv`/`_load_csv`), so a CSV written here loads into torch's
`_PipelineScheduleRuntime._load_csv` and torchtitan's `schedule_csv` option.

Stage placement: the *looped* style puts stage s on rank s % P (GPipe, 1F1B, interleaved,
looped BFS, ZB-H1/H2); the *V* style gives rank r the stages r and 2P-1-r (ZB-V, DualPipeV).
"""

from __future__ import annotations

import csv
import io
import re
from enum import Enum
from typing import NamedTuple

from planner.errors import ScheduleError


class ActionType(str, Enum):
    """What an action does; the values are torch's `_ComputationType` values."""

    FORWARD = "F"
    FULL_BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"


F = ActionType.FORWARD
B = ActionType.FULL_BACKWARD
I = ActionType.BACKWARD_INPUT  # noqa: E741 - torch's one-letter name for input-grad backward
W = ActionType.BACKWARD_WEIGHT
SEND_F = ActionType.SEND_F
RECV_F = ActionType.RECV_F
SEND_B = ActionType.SEND_B
RECV_B = ActionType.RECV_B

COMPUTE_TYPES = frozenset({F, B, I, W})
"""Action types that occupy a rank's compute stream (the rest are point-to-point transfers)."""


class Action(NamedTuple):
    """One step of one rank: `stage_index` is the global virtual-stage id (0..P*V-1)."""

    stage_index: int
    computation_type: ActionType
    microbatch_index: int | None = None

    def __str__(self) -> str:
        mb = "" if self.microbatch_index is None else str(self.microbatch_index)
        return f"{self.stage_index}{self.computation_type.value}{mb}"

    __repr__ = __str__

    @property
    def is_compute(self) -> bool:
        """True for F, B, I and W; False for sends and receives."""
        return self.computation_type in COMPUTE_TYPES

    @staticmethod
    def from_str(text: str) -> Action:
        """Parse the text form `[stage][type][microbatch]`, e.g. `2F0`, `3SEND_B1` (inverse of str)."""
        match = _ACTION_RE.fullmatch(text.strip())
        if match is None:
            raise ScheduleError(
                f"cannot parse pipeline action {text!r}: write [stage][type][microbatch] with type one of "
                f"{', '.join(t.value for t in ActionType)}, e.g. '2F0' or '1SEND_F3'"
            )
        stage, kind, mb = match.groups()
        return Action(int(stage), ActionType(kind), int(mb) if mb else None)


_ACTION_RE = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d*)")

PipelineOrder = dict[int, list[Action]]
"""rank -> that rank's actions in execution order (torch's `pipeline_order` without idle `None`s)."""

PLACEMENTS = ("loop", "v")


def stage_to_rank(stage: int, pp: int, vpp: int, style: str = "loop") -> int:
    """Rank that holds global virtual stage `stage` of a pipeline of `pp` ranks, `vpp` chunks each.

    Looped: rank = stage % pp (Megatron interleaving; torch `generate_stage_to_rank_mapping`
    style "loop"). V: chunk 0 runs down the ranks and chunk 1 back up, so rank r holds stages
    r and 2*pp-1-r (torch style "v", defined for vpp = 2).
    """
    num_stages = pp * vpp
    if not 0 <= stage < num_stages:
        raise ScheduleError(f"stage {stage} is outside 0..{num_stages - 1} for pp={pp}, vpp={vpp}")
    if style == "loop":
        return stage % pp
    if style == "v":
        if vpp != 2:
            raise ScheduleError(f"the V placement needs vpp=2 (two chunks per rank), got vpp={vpp}")
        return stage if stage < pp else num_stages - 1 - stage
    raise ScheduleError(f"unknown placement style {style!r}: use one of {', '.join(PLACEMENTS)}")


def rank_stages(rank: int, pp: int, vpp: int, style: str = "loop") -> tuple[int, ...]:
    """The stages of `rank` in chunk order (chunk c is the c-th smallest stage id on the rank)."""
    return tuple(s for s in range(pp * vpp) if stage_to_rank(s, pp, vpp, style) == rank)


def format_order(order: PipelineOrder) -> str:
    """Human-readable form: one line per rank, `rank r: 0F0 0F1 ...`."""
    return "\n".join(f"rank {r}: " + " ".join(map(str, order[r])) for r in sorted(order))


def to_csv(order: PipelineOrder) -> str:
    """torch's compute-only CSV: row r holds rank r's actions as text, comma-separated.

    Matches `PipelineScheduleMulti._dump_csv` (the `csv` module's default dialect), so the text
    loads with torch's `_load_csv` and torchtitan's `schedule_csv`.
    """
    ranks = sorted(order)
    if ranks != list(range(len(ranks))):
        raise ScheduleError(f"ranks must be numbered 0..{len(ranks) - 1}, got {ranks}")
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for r in ranks:
        writer.writerow([str(a) for a in order[r]])
    return buffer.getvalue()


def from_csv(text: str) -> PipelineOrder:
    """Inverse of `to_csv`; empty cells (torch's idle steps) are dropped."""
    order: PipelineOrder = {}
    for rank, row in enumerate(csv.reader(io.StringIO(text))):
        order[rank] = [Action.from_str(cell) for cell in row if cell.strip()]
    return order
