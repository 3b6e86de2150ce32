"""Stage cut points: how many transformer layers each pipeline rank runs, and in which
recompute mode, so that the slowest rank's time per micro-batch is as small as it can be
while every rank fits its memory.

Objective (the bottleneck): minimise max_r T_r, where rank r with n_r layers in mode m
costs T_r = e_r + sum of its layers' time in mode m per micro-batch and needs
c_r[m] + sum of its layers' bytes in mode m <= limit. e_r and c_r hold what does not
scale with layers (embedding on the first stage, head and loss on the last, the rank's
transient peak, the fixed allowance); a layer's bytes include its parameter state and its
activations times the micro-batches the schedule keeps in flight on that rank. Under every
schedule the busy time of the slowest rank, M x max_r T_r, is the step's dominant term,
and the sum of all T_r is fixed by the model, so the bottleneck is the quantity cut points
can change.

Three exact solvers of the same problem:
  * `balanced_cuts`: identical layers (every dense model here) — bisection on the
    bottleneck with a closed-form feasibility test per rank;
  * `sequence_cuts`: layers of a few kinds in a fixed order (an MoE model's dense-MLP and
    MoE blocks) — bisection on the bottleneck with a greedy feasibility test;
  * `dp_cuts`: per-layer costs that differ — dynamic programming over (rank, last layer);
  * `ilp_cuts` (planner/search/ilp.py): the same as a mixed-integer program (pulp).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RankCosts:
    """Per pipeline rank r and recompute mode m (modes indexed as in `modes`)."""

    modes: tuple[str, ...]
    fixed_s: tuple[float, ...]
    """e_r: per-micro-batch time on rank r that does not come from its transformer layers."""
    fixed_bytes: tuple[tuple[float, ...], ...]
    """c_r[m]: bytes on rank r that do not scale with its layers, in mode m."""
    layer_s: tuple[float, ...]
    """t_m: one layer's per-micro-batch time in mode m (identical layers)."""
    layer_bytes: tuple[tuple[float, ...], ...]
    """b_r[m]: one layer's bytes on rank r in mode m (state + in-flight activations)."""
    limit_bytes: float
    min_layers: int = 1
    """Layers every rank must get (one per chunk with interleaving)."""
    layer_kinds: tuple[int, ...] = ()
    """Layers of more than one kind (contiguous ranks only): per layer in model order, its
    kind's index into `kind_s` and `kind_bytes`; empty when every layer is as `layer_s`."""
    kind_s: tuple[tuple[float, ...], ...] = ()
    """[kind][mode]: one layer's per-micro-batch time."""
    kind_bytes: tuple[tuple[tuple[float, ...], ...], ...] = ()
    """[rank][kind][mode]: one layer's bytes on that rank."""

    @property
    def num_ranks(self) -> int:
        return len(self.fixed_s)


@dataclass(frozen=True, slots=True)
class Cuts:
    """Layers and recompute mode per rank, and the bottleneck time they reach."""

    layers: tuple[int, ...]
    modes: tuple[str, ...]
    bottleneck_s: float


def _memory_caps(costs: RankCosts) -> list[list[int]]:
    """[rank][mode] -> most layers that fit the memory (-1: not even the fixed part fits)."""
    caps = []
    for rank in range(costs.num_ranks):
        row = []
        for mode in range(len(costs.modes)):
            room = costs.limit_bytes - costs.fixed_bytes[rank][mode]
            per_layer = costs.layer_bytes[rank][mode]
            row.append(-1 if room < 0 else math.floor(room / per_layer) if per_layer > 0 else 10**9)
        caps.append(row)
    return caps


def _cap(costs: RankCosts, memory: list[list[int]], rank: int, mode: int, target: float) -> int:
    """Most layers rank `rank` can run in `mode` within `target` seconds and the memory."""
    by_memory = memory[rank][mode]
    slack = target - costs.fixed_s[rank]
    if by_memory < 0 or slack < 0:
        return -1
    if costs.layer_s[mode] <= 0 or math.isinf(slack):
        return by_memory
    return min(by_memory, math.floor(slack / costs.layer_s[mode] * (1 + 1e-12)))


def _caps(costs: RankCosts, memory: list[list[int]], num_layers: int, target: float) -> list[int] | None:
    """Per rank, the most layers it can run within `target` and memory (best mode), or None
    when some rank cannot run its minimum or all together cannot hold the model."""
    caps, total = [], 0
    finite = not math.isinf(target)
    for rank, fixed in enumerate(costs.fixed_s):
        slack = target - fixed
        if slack < 0:
            return None
        best = -1
        for by_memory, per_layer in zip(memory[rank], costs.layer_s):
            if by_memory < 0:
                continue
            cap = by_memory
            if finite and per_layer > 0:
                cap = min(cap, math.floor(slack / per_layer * (1 + 1e-12)))
            best = max(best, cap)
        if best < costs.min_layers:
            return None
        caps.append(min(best, num_layers))
        total += caps[-1]
    return caps if total >= num_layers else None


def balanced_cuts(costs: RankCosts, num_layers: int) -> Cuts | None:
    """The optimal cuts for identical layers, or None when no cut fits the memory.

    Feasibility of a bottleneck T is monotone in T, so bisection finds the least feasible
    T; the optimum is one of the values e_r + n t_m, so once the interval is narrower than
    a layer a bisection over the few such values inside it ends it."""
    memory = _memory_caps(costs)
    unbounded = _caps(costs, memory, num_layers, math.inf)
    if costs.num_ranks * costs.min_layers > num_layers or unbounded is None:
        return None
    lo, hi = _bracket(costs, memory, unbounded, num_layers)
    resolution = 0.5 * min(costs.layer_s) if min(costs.layer_s) > 0 else 0.0
    while hi - lo > max(resolution, 1e-12 * hi):
        mid = 0.5 * (lo + hi)
        if _caps(costs, memory, num_layers, mid) is None:
            lo = mid
        else:
            hi = mid
    values = sorted(set(_values_between(costs, num_layers, lo, hi)))
    first, last = 0, len(values) - 1  # values[last] == hi is feasible; feasibility is monotone
    while first < last:
        middle = (first + last) // 2
        if _caps(costs, memory, num_layers, values[middle]) is None:
            first = middle + 1
        else:
            last = middle
    hi = values[last]
    caps = _caps(costs, memory, num_layers, hi)
    assert caps is not None
    layers = _trim(costs, caps, num_layers)
    chosen = tuple(_fastest_mode(costs, memory, r, n, hi) for r, n in enumerate(layers))
    bottleneck = max(costs.fixed_s[r] + n * costs.layer_s[m] for r, (n, m) in enumerate(zip(layers, chosen)))
    return Cuts(layers=tuple(layers), modes=tuple(costs.modes[m] for m in chosen), bottleneck_s=bottleneck)


def _bracket(costs: RankCosts, memory: list[list[int]], unbounded: list[int], num_layers: int) -> tuple[float, float]:
    """An infeasible and a feasible bottleneck around the optimum. Below: every rank's
    minimum, and the fastest mode's time spread perfectly over the ranks. Above: one more
    fastest layer than that, which suffices unless memory binds; else each rank at the
    most layers the memory allows it (`unbounded`), in a mode that holds them."""
    fastest = min(costs.layer_s)
    ranks = costs.num_ranks
    below = max(
        max(costs.fixed_s) + costs.min_layers * fastest, (sum(costs.fixed_s) + num_layers * fastest) / ranks
    ) * (1 - 1e-9)
    near = below + fastest
    if fastest > 0 and _caps(costs, memory, num_layers, near) is not None:
        return below, near
    above = max(
        fixed + min(t for cap, t in zip(memory[r], costs.layer_s) if cap >= unbounded[r]) * unbounded[r]
        for r, fixed in enumerate(costs.fixed_s)
    )
    return near, above


def _values_between(costs: RankCosts, num_layers: int, lo: float, hi: float) -> list[float]:
    """The candidate bottlenecks e_r + n t_m in (lo, hi], and hi itself."""
    values = [hi]
    for _r, fixed in enumerate(costs.fixed_s):
        for t in costs.layer_s:
            if t <= 0:
                continue
            first = max(costs.min_layers, math.floor((lo - fixed) / t))
            for n in range(first, min(num_layers, math.ceil((hi - fixed) / t)) + 1):
                if lo < fixed + n * t <= hi:
                    values.append(fixed + n * t)
    return values


def _trim(costs: RankCosts, caps: list[int], num_layers: int) -> list[int]:
    """Lower the caps to sum to num_layers, always taking a layer from the rank that is
    then slowest (ties: the later rank, which holds fewer micro-batches in flight)."""
    layers = list(caps)
    fastest = min(costs.layer_s)
    while sum(layers) > num_layers:
        rank = max(
            (r for r in range(len(layers)) if layers[r] > costs.min_layers),
            key=lambda r: (costs.fixed_s[r] + layers[r] * fastest, r),
        )
        layers[rank] -= 1
    return layers


def _fastest_mode(costs: RankCosts, memory: list[list[int]], rank: int, layers: int, target: float) -> int:
    """The quickest mode in which `rank` runs `layers` layers within target and memory."""
    fitting = [m for m in range(len(costs.modes)) if _cap(costs, memory, rank, m, target) >= layers]
    return min(fitting, key=lambda m: (costs.layer_s[m], m))


def dp_cuts(
    layer_s: list[list[float]],
    layer_bytes: list[list[list[float]]],
    fixed_s: list[float],
    fixed_bytes: list[list[float]],
    limit_bytes: float,
    modes: tuple[str, ...],
    min_layers: int = 1,
) -> Cuts | None:
    """Optimal contiguous cuts for per-layer costs that differ: layer_s[m][l] is layer l's
    time in mode m, layer_bytes[r][m][l] its bytes on rank r. None when nothing fits."""
    num_layers, ranks = len(layer_s[0]), len(fixed_s)
    prefix_s = [[0.0, *_running_sum(row)] for row in layer_s]
    prefix_b = [[[0.0, *_running_sum(row)] for row in per_rank] for per_rank in layer_bytes]
    inf = math.inf
    # best[r][j]: bottleneck of ranks 0..r covering layers [0, j); choice[r][j]: (i, mode)
    best = [[inf] * (num_layers + 1) for _ in range(ranks)]
    choice: list[list[tuple[int, int]]] = [[(-1, -1)] * (num_layers + 1) for _ in range(ranks)]
    for r in range(ranks):
        starts = [0] if r == 0 else range(num_layers + 1)
        for i in starts:
            before = 0.0 if r == 0 else best[r - 1][i]
            if before == inf:
                continue
            for j in range(i + min_layers, num_layers + 1):
                for m in range(len(modes)):
                    if fixed_bytes[r][m] + prefix_b[r][m][j] - prefix_b[r][m][i] > limit_bytes:
                        continue
                    value = max(before, fixed_s[r] + prefix_s[m][j] - prefix_s[m][i])
                    if value < best[r][j]:
                        best[r][j], choice[r][j] = value, (i, m)
    if best[ranks - 1][num_layers] == inf:
        return None
    layers, chosen, j = [], [], num_layers
    for r in range(ranks - 1, -1, -1):
        i, m = choice[r][j]
        layers.append(j - i)
        chosen.append(modes[m])
        j = i
    return Cuts(layers=tuple(reversed(layers)), modes=tuple(reversed(chosen)), bottleneck_s=best[ranks - 1][num_layers])


def exact_cuts(costs: RankCosts, num_layers: int) -> Cuts | None:
    """The optimal cuts: `sequence_cuts` for layers of several kinds, else `balanced_cuts`."""
    if costs.layer_kinds:
        return sequence_cuts(costs)
    return balanced_cuts(costs, num_layers)


def sequence_cuts(costs: RankCosts) -> Cuts | None:
    """The optimal contiguous cuts for layers of a few kinds in a fixed order
    (`costs.layer_kinds`), or None when no cut fits the memory.

    Feasibility of a bottleneck T is monotone in T. Filling each rank in turn with as many
    layers as it can run within T and its memory places every layer only if some cuts reach
    T, but can miss cuts that exist (stopping a rank earlier can spare the next one a layer
    it cannot run), so where the greedy fill fails the exact test decides: the set of layers
    each rank can end at, from the set the previous one can. Bisection narrows T to below
    half the cheapest layer, then each fill's own bottleneck, strictly lower each time,
    steps down to the least one."""
    kinds, ranks, modes = costs.layer_kinds, costs.num_ranks, range(len(costs.modes))
    num_layers, least = len(kinds), costs.min_layers
    if ranks * least > num_layers:
        return None
    # prefix sums per mode of the layers' time, and per rank and mode of their bytes
    time_before = [list(itertools.accumulate((costs.kind_s[k][m] for k in kinds), initial=0.0)) for m in modes]
    bytes_before = [
        [list(itertools.accumulate((per_rank[k][m] for k in kinds), initial=0.0)) for m in modes]
        for per_rank in costs.kind_bytes
    ]
    room = [[costs.limit_bytes - costs.fixed_bytes[r][m] for m in modes] for r in range(ranks)]

    def fits(rank: int, mode: int, start: int, end: int, target: float) -> bool:
        t, b = time_before[mode], bytes_before[rank][mode]
        return costs.fixed_s[rank] + t[end] - t[start] <= target and b[end] - b[start] <= room[rank][mode]

    def fastest(rank: int, start: int, end: int, target: float) -> int:
        fitting = [m for m in modes if fits(rank, m, start, end, target)]
        return min(fitting, key=lambda m: (time_before[m][end] - time_before[m][start], m)) if fitting else -1

    def greedy(target: float) -> list[int] | None:
        """Cut points filling each rank as far as it goes, or None where that fails."""
        bounds, start = [0], 0
        for rank in range(ranks):
            last, best = num_layers - (ranks - 1 - rank) * least, -1
            for mode in modes:
                lo, hi = start + least, last
                if lo > hi or not fits(rank, mode, start, lo, target):
                    continue
                while lo < hi:  # the furthest end that fits: cost grows with the end
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if fits(rank, mode, start, mid, target) else (lo, mid - 1)
                best = max(best, lo)
            if best < 0:
                return None
            bounds.append(best)
            start = best
        return bounds if start == num_layers else None

    def exact(target: float) -> list[int] | None:
        """Cut points within `target` if any exist: the ends each rank can reach, then back."""
        reach = [[True] + [False] * num_layers]
        for rank in range(ranks):
            cover = [0] * (num_layers + 2)
            last = num_layers - (ranks - 1 - rank) * least
            slack, starts = target - costs.fixed_s[rank], [i for i, ok in enumerate(reach[-1]) if ok]
            for mode in modes:
                t, b, space = time_before[mode], bytes_before[rank][mode], room[rank][mode]
                end = 0
                for start in starts:
                    end = max(end, start)  # the furthest end within target grows with the start
                    while end < last and t[end + 1] - t[start] <= slack and b[end + 1] - b[start] <= space:
                        end += 1
                    if end >= start + least:
                        cover[start + least] += 1
                        cover[end + 1] -= 1
            reach.append(list(itertools.accumulate(cover[:-1], lambda a, b: a + b)))
            reach[-1] = [n > 0 for n in reach[-1]]
        if not reach[-1][num_layers]:
            return None
        bounds = [num_layers]
        for rank in range(ranks - 1, -1, -1):
            end = bounds[-1]
            start = next(i for i in range(end - least, -1, -1) if reach[rank][i] and fastest(rank, i, end, target) >= 0)
            bounds.append(start)
        return bounds[::-1]

    def fill(target: float) -> tuple[list[int], float] | None:
        bounds = greedy(target) or exact(target)
        if bounds is None:
            return None
        worst = 0.0
        for r, (a, b) in enumerate(zip(bounds, bounds[1:])):
            t = time_before[fastest(r, a, b, target)]
            worst = max(worst, costs.fixed_s[r] + t[b] - t[a])
        return bounds, worst

    found = fill(math.inf)
    if found is None:
        return None
    times = [t for row in costs.kind_s for t in row if t > 0]
    cheapest, dearest = min(times, default=0.0), max(times, default=0.0)
    fastest_kind = [min(row) for row in costs.kind_s]
    lo = max(max(costs.fixed_s), (sum(costs.fixed_s) + sum(fastest_kind[k] for k in kinds)) / ranks) * (1 - 1e-9)
    hi = found[1]
    if lo + dearest < hi and (near := fill(lo + dearest)) is not None:
        found, hi = near, near[1]
    while hi - lo > max(0.5 * cheapest, 1e-12 * hi):
        mid = 0.5 * (lo + hi)
        better = fill(mid)
        if better is None:
            lo = mid
        else:
            found, hi = better, better[1]
    while (better := fill(found[1] * (1 - 1e-12))) is not None:
        found = better
    bounds, worst = found
    layers = [b - a for a, b in zip(bounds, bounds[1:])]
    chosen = [fastest(r, a, b, worst) for r, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return Cuts(layers=tuple(layers), modes=tuple(costs.modes[m] for m in chosen), bottleneck_s=worst)


def _running_sum(values: list[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def split_into_chunks(layers: int, vpp: int) -> list[int]:
    """A rank's layers over its vpp chunks, as even as possible (extra layers go first)."""
    base, extra = divmod(layers, vpp)
    return [base + (1 if c < extra else 0) for c in range(vpp)]
