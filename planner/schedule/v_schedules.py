"""The V-shaped schedules: two chunks per rank, rank r holding stages r and 2P-1-r.

Chunk "down" (stage r) is on the way from rank 0 to rank P-1, chunk "up" (stage 2P-1-r) on
the way back, so the loss is computed on rank 0 and the first and last stages share a rank.
Orders equal torch's ScheduleZBVZeroBubble and ScheduleDualPipeV.
"""

from __future__ import annotations

from collections import Counter, deque
from functools import lru_cache

from planner.schedule.actions import Action, ActionType, B, F, I, PipelineOrder, W


class _RankBuilder:
    """Appends actions to one rank's list, numbering micro-batches per (stage, kind).

    B and I share a counter (a micro-batch's backward is one or the other); every I queues
    its W, which `pop_w` emits oldest first.
    """

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.count: Counter[tuple[int, ActionType]] = Counter()
        self.pending_w: deque[Action] = deque()

    def add(self, stage: int, kind: ActionType) -> None:
        """Append `kind` of `stage` for its next micro-batch."""
        key = (stage, I if kind is B else kind)
        mb = self.count.get(key, 0)
        self.count[key] = mb + 1
        self.actions.append(Action(stage, kind, mb))
        if kind is I:
            self.pending_w.append(Action(stage, W, mb))

    def add_w(self, stage: int) -> None:
        """W of `stage`'s oldest micro-batch whose W is not yet listed (ZB-V's own numbering)."""
        self.add(stage, W)

    def pop_w(self) -> None:
        """The oldest queued W of any stage, if any (DualPipeV's weight queue)."""
        if self.pending_w:
            self.actions.append(self.pending_w.popleft())


def zbv(pp: int, num_microbatches: int) -> PipelineOrder:
    """ZB-V (Qi et al. 2024, section 6; torch ScheduleZBVZeroBubble).

    Rank r: 2(P-r)-1 forwards of the down chunk; r (up F, down F) pairs; P-r (up F, I, W)
    triples; then steady (down F, I, W, up F, I, W) until the forwards run out; cool-down
    r (down I, up I) pairs, P-r (down I, W) pairs, then the remaining up and down W's.
    Built for max(M, 2P-1) micro-batches and trimmed to M, as torch does.
    """
    padded = _zbv_padded(pp, max(2 * pp - 1, num_microbatches))
    return {r: [a for a in actions if a[2] < num_microbatches] for r, actions in enumerate(padded)}


@lru_cache(maxsize=16)
def _zbv_padded(pp: int, padded: int) -> tuple[tuple[Action, ...], ...]:
    """Per rank, ZB-V's actions for `padded` >= 2P-1 micro-batches, before `zbv` trims them;
    cached: every M below 2P-1 trims the same build (a search asks for several M per P)."""
    order = []
    for r in range(pp):
        down, up = r, 2 * pp - 1 - r
        rank = _RankBuilder()
        for _ in range(2 * (pp - r) - 1):
            rank.add(down, F)
        for _ in range(r):
            rank.add(up, F)
            rank.add(down, F)
        for _ in range(pp - r):
            rank.add(up, F)
            rank.add(up, I)
            rank.add_w(up)
        count = rank.count
        while count[(up, F)] < count[(down, F)] or count[(down, F)] < padded:
            if count[(down, F)] < padded:
                rank.add(down, F)
            rank.add(down, I)
            rank.add_w(down)
            rank.add(up, F)
            rank.add(up, I)
            rank.add_w(up)
        for _ in range(r):
            rank.add(down, I)
            rank.add(up, I)
        for _ in range(pp - r):
            rank.add(down, I)
            rank.add_w(down)
        for stage in (up, down):
            while count[(stage, W)] < count[(stage, I)]:
                rank.add_w(stage)
        order.append(tuple(rank.actions))
    return tuple(order)


def dualpipev(pp: int, num_microbatches: int) -> PipelineOrder:
    """DualPipeV (DeepSeek-AI 2024, DualPipe's V variant; torch ScheduleDualPipeV), M >= 2P.

    Rank r: 2(P-r-1) down forwards; r+1 (down F, up F); P-r-1 (up I, queued W, up F); then
    M-2P+r+1 steps of the overlapped pairs (down F + up B, up F + down B); P-r-1
    (up B, up F + down B); r+1 (up, down) backwards that switch from full B to I halfway;
    P-r-1 (queued W, down backward); r+1 queued W's. torch runs each overlapped pair as one
    OVERLAP_F_B action; here it is its forward followed by its backward (their order within
    the pair), which is how torch executes it without a custom overlap function.
    """
    order: PipelineOrder = {}
    for r in range(pp):
        down, up = r, 2 * pp - 1 - r
        rank = _RankBuilder()
        for _ in range(2 * (pp - r - 1)):
            rank.add(down, F)
        for _ in range(r + 1):
            rank.add(down, F)
            rank.add(up, F)
        for _ in range(pp - r - 1):
            rank.add(up, I)
            rank.pop_w()
            rank.add(up, F)
        for _ in range(num_microbatches - 2 * pp + r + 1):
            rank.add(down, F)
            rank.add(up, B)
            rank.add(up, F)
            rank.add(down, B)
        for _ in range(pp - r - 1):
            rank.add(up, B)
            rank.add(up, F)
            rank.add(down, B)
        split = False
        half = (r + 1) // 2
        for i in range(r + 1):
            if i == half and r % 2 == 1:
                split = True
            rank.add(up, I if split else B)
            if i == half and r % 2 == 0:
                split = True
            rank.add(down, I if split else B)
        for _ in range(pp - r - 1):
            rank.pop_w()
            rank.add(down, I if split else B)
        for _ in range(r + 1):
            rank.pop_w()
        order[r] = rank.actions
    return order
