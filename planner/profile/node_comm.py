"""Measured collective times inside a node, as curves the communication model can read.

`planner profile --collectives` stores one `CollectiveRow` per (op, backend, group size,
message size). `measured_curves` turns the rows of one group size into, per op, the
measured (bytes, seconds) points and an interpolation between them:

- between two measured sizes: linear in log(bytes)-log(seconds) (piecewise power law, exact
  at every measured size, monotone where the measurements are);
- below the smallest size: the smallest size's time (latency-bound: a smaller message does
  not go faster than the fixed cost measured);
- above the largest size: the largest size's time scaled by bytes / largest bytes (the
  bandwidth measured at the largest message, which is the asymptotic one).

Sizes and times follow nccl-tests (see planner/profile/collectives.py): `bytes` is the
all-reduce buffer, the all-gather output, the reduce-scatter input, each rank's all-to-all
input, the send/recv message; times are the slowest rank's, one way for send/recv. Pure:
no torch, no I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from planner.errors import PlannerError
from planner.profile.schema import CollectiveRow, Profile

NETWORK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""The collectives the communication model takes measured curves for (send/recv is the
pipeline's p2p, modelled on its own)."""

BACKEND_PREFERENCE = ("nccl", "gloo")
"""The backend whose rows are used when a profile holds several (GPU over CPU)."""


@dataclass(frozen=True, slots=True)
class CommCurve:
    """Measured time of one collective over one group size, as a function of message bytes."""

    op: str
    backend: str
    group_size: int
    points: tuple[tuple[int, float], ...]
    """(bytes, seconds), strictly increasing in bytes; at least one point."""

    def seconds(self, nbytes: float) -> float:
        """Time of one call moving `nbytes` (interpolated as the module docstring says)."""
        if nbytes <= 0:
            return 0.0
        sizes = [size for size, _ in self.points]
        first_bytes, first_s = self.points[0]
        last_bytes, last_s = self.points[-1]
        if nbytes <= first_bytes:
            return first_s
        if nbytes >= last_bytes:
            return last_s * nbytes / last_bytes
        upper = bisect_left(sizes, nbytes)
        (b0, t0), (b1, t1) = self.points[upper - 1], self.points[upper]
        weight = math.log(nbytes / b0) / math.log(b1 / b0)
        return math.exp(math.log(t0) + weight * math.log(t1 / t0))

    def bus_bandwidth_bps(self, nbytes: float) -> float:
        """nccl-tests bus bandwidth (bytes/s) at `nbytes`: algbw x the op's bus factor."""
        return nbytes / self.seconds(nbytes) * bus_factor(self.op, self.group_size)


def bus_factor(op: str, group_size: int) -> float:
    """busbw / algbw for `op` over `group_size` ranks (nccl-tests PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2 * (group_size - 1) / group_size
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (group_size - 1) / group_size
    return 1.0


def measured_group_sizes(profile: Profile) -> list[int]:
    """Group sizes the profile has collective rows for, ascending."""
    return sorted({row.world_size for row in profile.collectives})


def measured_curves(profile: Profile, group_size: int | None = None) -> dict[str, CommCurve]:
    """Per op, the curve measured over `group_size` ranks (default: the largest group, the
    whole node), from the preferred backend's rows; {} when the profile has no collectives.
    send_recv is between two ranks whatever `group_size` is. PlannerError when the profile
    has collectives but none over `group_size`."""
    if not profile.collectives:
        return {}
    sizes = measured_group_sizes(profile)
    size = group_size if group_size is not None else sizes[-1]
    rows = [r for r in profile.collectives if r.world_size == size or (r.op == "send_recv" and r.world_size == 2)]
    if not any(r.world_size == size for r in rows):
        raise PlannerError(f"profile has collectives over {', '.join(map(str, sizes))} ranks, not over {size}")
    curves = {}
    for op in sorted({r.op for r in rows}):
        curves[op] = _curve(op, [r for r in rows if r.op == op])
    return curves


def _curve(op: str, rows: list[CollectiveRow]) -> CommCurve:
    backend = next(
        b for b in (*BACKEND_PREFERENCE, *sorted({r.backend for r in rows})) if any(r.backend == b for r in rows)
    )
    chosen = sorted((r for r in rows if r.backend == backend), key=lambda r: r.bytes)
    group = max(r.world_size for r in chosen)
    points = tuple((r.bytes, r.time_us * 1e-6) for r in chosen if r.world_size == group)
    return CommCurve(op=op, backend=backend, group_size=group, points=points)


def network_curves(profile: Profile) -> dict[str, Callable[[float, int], float]]:
    """Per collective the network model knows (all-reduce, all-gather, reduce-scatter,
    all-to-all), the seconds of (bytes, group size) inside the node from the profile's rows,
    for `planner.cost.comm.Network.of(cluster, measured=...)`. A group size the profile
    measured reads its own curve; any other reads the nearest measured size's bus bandwidth
    at that message size (nccl-tests' busbw is the group-size-free figure of a collective),
    times the op's bus factor for the asked size. {} when the profile has no collectives."""
    by_size = {size: measured_curves(profile, size) for size in measured_group_sizes(profile)}
    ops = {op for curves in by_size.values() for op in curves} & set(NETWORK_OPS)

    def reader(op: str) -> Callable[[float, int], float]:
        def seconds(nbytes: float, group_size: int) -> float:
            measured = {size: curves[op] for size, curves in by_size.items() if op in curves}
            if group_size in measured:
                return measured[group_size].seconds(nbytes)
            nearest = measured[min(measured, key=lambda size: abs(math.log(size / group_size)))]
            return nbytes * bus_factor(op, group_size) / nearest.bus_bandwidth_bps(nbytes)

        return seconds

    return {op: reader(op) for op in sorted(ops)}
