"""The collective model's bus bandwidth against published nccl-tests tables (tests/data/nccl_tests.toml).

The tables only validate: every model parameter comes from planner/presets/networks.toml (NCCL's
tuning constants, NVLink link counts) and the GPU presets. The regimes are read off each
published curve (not off the model), and the tolerances are on nccl-tests' bus bandwidth
(busbw = bytes / time x 2(n-1)/n for an all-reduce):

- bandwidth regime (published busbw >= 90 % of the table's peak): within 25 %;
- below it (latency and protocol regimes): predicted busbw between -25 % and +150 % of the
  published one, i.e. the predicted call never more than 25 % slower and at most 2.5x faster.

The model is optimistic below the bandwidth regime, for two reasons it cannot see: the small-
message time is host-bound (kernel launch and NCCL's enqueue; the Azure tables run in VMs, 25-45
us per call, against 12-19 us on bare-metal Hopper nodes), and NCCL's own tuning model, which
this follows, has no pipeline-fill term at medium sizes (it is NCCL's selection model, not a
predictor). Measured per-point errors are in docs/collectives.md.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from planner.catalog import resolve_gpu
from planner.cost.comm import Network
from planner.cost.comm.nccl import ring_all_reduce_us
from planner.spec import Cluster

DATA = Path(__file__).parents[1] / "data" / "nccl_tests.toml"
TABLES = tomllib.loads(DATA.read_text())["table"]


def _predicted_busbw(table: dict, nbytes: float) -> float:
    n, k = table["ranks"], table["ranks_per_node"]
    cluster = Cluster.of(resolve_gpu(table["gpu"]), n, **table.get("cluster", {}))
    net = Network.of(cluster)
    stride = 1 if k > 1 else cluster.gpus_per_node
    if table.get("algorithm") == "ring":
        f = net.fabric
        seconds = (f.launch_us + min(ring_all_reduce_us(f, nbytes, n, k, p) for p in range(3))) * 1e-6
    else:
        seconds = getattr(net, table["collective"])(nbytes, n, stride)
    factor = 2 * (n - 1) / n if table["collective"] == "all_reduce" else (n - 1) / n
    return nbytes / seconds / 1e9 * factor


def _points(bandwidth_regime: bool):
    for table in TABLES:
        peak = max(busbw for _, busbw in table["points"])
        for nbytes, busbw in table["points"]:
            if (busbw >= 0.9 * peak) == bandwidth_regime:
                yield pytest.param(table, nbytes, busbw, id=f"{table['name']}-{nbytes}")


def test_every_table_cites_its_source_and_system():
    assert len({t["gpu"] for t in TABLES}) >= 2  # A100 and H100-class nodes at least
    for table in TABLES:
        assert table["source"].startswith("https://"), table["name"]
        assert table["system"] and table["points"]


@pytest.mark.parametrize("table,nbytes,busbw", list(_points(bandwidth_regime=True)))
def test_bandwidth_regime_within_25_percent(table, nbytes, busbw):
    assert _predicted_busbw(table, nbytes) == pytest.approx(busbw, rel=0.25)


@pytest.mark.parametrize("table,nbytes,busbw", list(_points(bandwidth_regime=False)))
def test_below_the_bandwidth_regime_bounded(table, nbytes, busbw):
    assert -0.25 <= _predicted_busbw(table, nbytes) / busbw - 1 <= 1.5


def test_curves_rise_then_saturate_like_the_tables():
    """Bus bandwidth grows with size through the latency and protocol regimes and flattens at
    the top, as every published curve does."""
    for table in TABLES:
        if len(table["points"]) < 10:
            continue
        sizes = [nbytes for nbytes, _ in table["points"]]
        predicted = [_predicted_busbw(table, s) for s in sizes]
        assert all(b >= a * 0.999 for a, b in zip(predicted, predicted[1:])), table["name"]
        assert predicted[-1] / predicted[-2] < 1.01  # saturated
        assert predicted[0] < 0.01 * predicted[-1]  # latency-bound at 1 KiB
