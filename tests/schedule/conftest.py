"""Shared helpers for the schedule tests."""

from __future__ import annotations

import pytest


class StageStub:
    """The attributes torch's pipeline-schedule constructors read from a stage; enough to
    build a schedule and read its `pipeline_order` without a process group."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = 0
        self.submod = None


@pytest.fixture
def stage_stub() -> type[StageStub]:
    return StageStub


def reference_times(order, costs):
    """Start and end of every action, computed independently of the simulator: a DAG of
    rank-order and data-dependency edges (networkx), each action starting at the latest
    end (+ p2p across ranks) of its predecessors. Raises networkx.NetworkXUnfeasible on a
    cycle, i.e. a deadlock."""
    import networkx as nx

    rank_of = {a.stage_index: r for r, acts in order.items() for a in acts}
    chunks = {r: sorted({a.stage_index for a in acts}) for r, acts in order.items()}
    last_stage = max(rank_of)

    def duration(a):
        r = rank_of[a.stage_index]
        c = chunks[r].index(a.stage_index)
        factor = costs.slowdown[r] if costs.slowdown else 1.0
        f, i, w = costs.forward_s[r][c], costs.backward_input_s[r][c], costs.backward_weight_s[r][c]
        return factor * {"F": f, "I": i, "W": w, "B": i + w}[a.computation_type.value]

    backward = {
        (a.stage_index, a.microbatch_index): a
        for acts in order.values()
        for a in acts
        if a.computation_type.value in "BI"
    }
    forward = {
        (a.stage_index, a.microbatch_index): a
        for acts in order.values()
        for a in acts
        if a.computation_type.value == "F"
    }
    graph = nx.DiGraph()
    for acts in order.values():
        graph.add_nodes_from(acts)
        for before, after in zip(acts, acts[1:]):
            graph.add_edge(before, after, lag=0.0)
    for acts in order.values():
        for a in acts:
            s, kind, m = a.stage_index, a.computation_type.value, a.microbatch_index
            if kind == "F" and s > 0:
                src = forward[(s - 1, m)]
            elif kind in "BI" and s < last_stage:
                src = backward[(s + 1, m)]
            elif kind in "BI":
                src = forward[(s, m)]
            elif kind == "W":
                src = backward[(s, m)]
            else:
                continue
            lag = costs.p2p_s if rank_of[src.stage_index] != rank_of[s] else 0.0
            graph.add_edge(src, a, lag=lag)
    times = {}
    for a in nx.topological_sort(graph):
        start = max((times[p][1] + graph[p][a]["lag"] for p in graph.predecessors(a)), default=0.0)
        times[a] = (start, start + duration(a))
    return times
