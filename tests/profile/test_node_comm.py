"""Measured collective curves: exact at measured sizes, a power law between them, latency
below and bandwidth above the measured range, one group size and one backend at a time."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.errors import PlannerError
from planner.profile import store
from planner.profile.node_comm import bus_factor, measured_curves, measured_group_sizes
from planner.profile.schema import CollectiveRow, Profile
from tests.profile.profile_factories import make_profile

SIZES = [1024 * 4**i for i in range(6)]  # 1 KiB .. 1 MiB


def _alpha_beta(nbytes: int, alpha_us: float, gbps: float) -> float:
    """Microseconds of an alpha-beta link: latency plus bytes over bandwidth."""
    return alpha_us + nbytes / (gbps * 1e3)


def _rows(op="all_reduce", group=8, backend="nccl", alpha_us=10.0, gbps=100.0):
    rows = []
    for size in SIZES:
        t = _alpha_beta(size, alpha_us, gbps)
        algbw = size / t / 1e3
        rows.append(
            CollectiveRow(
                op=op,
                backend=backend,
                world_size=group,
                bytes=size,
                time_us=t,
                algbw_gbps=algbw,
                busbw_gbps=algbw * bus_factor(op, group),
            )
        )
    return rows


def test_exact_at_every_measured_size():
    curve = measured_curves(make_profile(collectives=tuple(_rows())))["all_reduce"]
    for size in SIZES:
        assert curve.seconds(size) == pytest.approx(_alpha_beta(size, 10.0, 100.0) * 1e-6, rel=1e-12)


def test_a_power_law_is_interpolated_exactly():
    # t = c * bytes^0.7 measured at the grid: log-log interpolation reproduces it anywhere inside
    rows = [
        CollectiveRow(
            op="all_gather",
            backend="nccl",
            world_size=4,
            bytes=s,
            time_us=0.02 * s**0.7,
            algbw_gbps=1.0,
            busbw_gbps=0.75,
        )
        for s in SIZES
    ]
    curve = measured_curves(make_profile(collectives=tuple(rows)))["all_gather"]
    for size in (1500, 5000, 100_000, 700_000):
        assert curve.seconds(size) == pytest.approx(0.02 * size**0.7 * 1e-6, rel=1e-9)


@given(st.floats(min_value=1024, max_value=SIZES[-1]), st.floats(min_value=1024, max_value=SIZES[-1]))
def test_monotone_inside_the_measured_range(a, b):
    curve = measured_curves(make_profile(collectives=tuple(_rows())))["all_reduce"]
    low, high = sorted((a, b))
    assert curve.seconds(low) <= curve.seconds(high) * (1 + 1e-12)


def test_latency_below_and_bandwidth_above_the_range():
    curve = measured_curves(make_profile(collectives=tuple(_rows())))["all_reduce"]
    smallest = _alpha_beta(SIZES[0], 10.0, 100.0) * 1e-6
    assert curve.seconds(1) == curve.seconds(512) == pytest.approx(smallest)
    largest = _alpha_beta(SIZES[-1], 10.0, 100.0) * 1e-6
    assert curve.seconds(8 * SIZES[-1]) == pytest.approx(8 * largest)
    assert curve.seconds(0) == 0.0
    # bus bandwidth at the largest size: algbw x 2(n-1)/n for an all-reduce over 8
    assert curve.bus_bandwidth_bps(SIZES[-1]) == pytest.approx(SIZES[-1] / largest * 2 * 7 / 8)


def test_group_size_and_backend_selection():
    rows = (
        *_rows(group=8, gbps=100.0),
        *_rows(group=2, gbps=40.0),
        *_rows(group=8, backend="gloo", gbps=1.0),
        *_rows(op="send_recv", group=2, gbps=50.0),
    )
    profile = make_profile(collectives=rows)
    assert measured_group_sizes(profile) == [2, 8]
    node = measured_curves(profile)
    assert set(node) == {"all_reduce", "send_recv"}
    assert (node["all_reduce"].backend, node["all_reduce"].group_size) == ("nccl", 8)
    assert node["send_recv"].group_size == 2  # point-to-point is between two ranks
    pair = measured_curves(profile, group_size=2)["all_reduce"]
    assert pair.seconds(SIZES[-1]) == pytest.approx(_alpha_beta(SIZES[-1], 10.0, 40.0) * 1e-6)
    with pytest.raises(PlannerError, match="not over 4"):
        measured_curves(profile, group_size=4)
    assert measured_curves(make_profile()) == {}


def test_version_1_profiles_still_load(tmp_path):
    # the format before `block`, the counts and all_to_all: what profiles/ ships
    document = make_profile(collectives=tuple(_rows(op="reduce_scatter"))).model_dump(mode="json")
    document["schema_version"] = 1
    del document["block"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(document))
    loaded = store.load(path)
    assert loaded.block == "planner" and loaded.schema_version == 1
    assert math.isclose(
        measured_curves(loaded)["reduce_scatter"].seconds(SIZES[0]), _alpha_beta(SIZES[0], 10.0, 100.0) * 1e-6
    )
    assert isinstance(loaded, Profile)


def test_plan_profile_uses_the_nodes_measured_collectives(tmp_path):
    """`--profile` with collective rows: groups inside one node read the measured curve (the
    measured group size exactly; another size through the nearest size's bus bandwidth),
    groups across nodes keep the NCCL model."""
    from planner.catalog import resolve_gpu, resolve_model
    from planner.cost.comm import Network
    from planner.job import build_cost_model
    from planner.spec import Cluster
    from tests.profile.profile_factories import ok_row

    rows = (*_rows(group=8, gbps=100.0), *_rows(op="send_recv", group=2, gbps=50.0))
    profile = make_profile(
        rows=(ok_row(kind="transformer"), ok_row(kind="embedding"), ok_row(kind="head")), collectives=rows
    )
    path = tmp_path / "prof.json"
    store.save(path, profile)
    cluster = Cluster.of(resolve_gpu("h100"), 16)
    model = build_cost_model(resolve_model("tiny-llama"), cluster, path)
    big = SIZES[-1]
    assert model.network.all_reduce(big, 8, 1) == pytest.approx(_alpha_beta(big, 10.0, 100.0) * 1e-6)
    busbw = big / (_alpha_beta(big, 10.0, 100.0) * 1e-6) * bus_factor("all_reduce", 8)
    assert model.network.all_reduce(big, 4, 1) == pytest.approx(big * bus_factor("all_reduce", 4) / busbw)
    across = Network.of(cluster)
    assert model.network.all_reduce(big, 16, 1) == pytest.approx(across.all_reduce(big, 16, 1))
    assert model.network.all_gather(big, 8, 1) == pytest.approx(across.all_gather(big, 8, 1))  # not measured
