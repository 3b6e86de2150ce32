"""The MoE load-imbalance default (planner/cost/moe.py `DEFAULT_IMBALANCE`): the published
training measurement it comes from, the other reading of it and the earlier prior, and the
`--moe-imbalance` knob overriding it end to end."""

from __future__ import annotations

import json

import pytest

from planner.catalog import resolve_model
from planner.cost.model import CostOptions
from planner.cost.moe import DEFAULT_IMBALANCE, imbalance_of
from planner.cost.shapes import Shard

JOB = [
    "--model",
    "mixtral-8x7b",
    "--gpus",
    "16",
    "--gpu",
    "h100",
    "--global-batch",
    "64",
    "--seq",
    "4096",
    "--tp",
    "2",
    "--ep",
    "8",
]


def test_default_is_feplbs_idle_share_read_as_max_over_mean():
    # FEPLB (Qi, Liu, Zhao 2026, arXiv 2604.19654), Figure 1(b) as its review quotes it: GLM-5
    # MoE layers, 128 routed experts, EP 8, no auxiliary loss, "18.6% of GPU time per MoE layer"
    # lost waiting for the busiest rank. Ranks idle for max - t_r of a layer that lasts max, so
    # the lost share is 1 - mean / max; simulate it on loads with that max / mean:
    loads = [DEFAULT_IMBALANCE] + [(8 - DEFAULT_IMBALANCE) / 7] * 7  # mean 1, busiest DEFAULT_IMBALANCE
    idle = sum(max(loads) - t for t in loads) / (len(loads) * max(loads))
    assert idle == pytest.approx(0.186, abs=5e-4)
    assert CostOptions().moe.moe_imbalance == DEFAULT_IMBALANCE


def test_other_reading_and_the_old_prior_are_close():
    # read as max / mean - 1 the same 18.6% gives 1.186; Switch Transformer's capacity factor
    # (Fedus et al. 2022, JMLR, Table 1: 1.25), the earlier prior, is the head-room per expert
    assert abs(1.186 / DEFAULT_IMBALANCE - 1) < 0.04
    assert abs(1.25 / DEFAULT_IMBALANCE - 1) < 0.02


def test_capacity_factor_and_one_rank_override_the_dropless_default():
    dropless = resolve_model("mixtral-8x7b")
    dropping = dropless.model_copy(update={"moe_capacity_factor": 1.1})
    ep8, ep1 = Shard(mbs=1, seq=4096, ep=8, etp=1), Shard(mbs=1, seq=4096, ep=1, etp=1)
    assert imbalance_of(dropless, ep8, DEFAULT_IMBALANCE) == DEFAULT_IMBALANCE
    assert imbalance_of(dropping, ep8, DEFAULT_IMBALANCE) == 1.1
    assert imbalance_of(dropless, ep1, 1.7) == 1.0


def _predicted(cli, *argv):
    code, out, err = cli("evaluate", *JOB, *argv, "--json")
    assert code == 0, err
    return json.loads(out)["plans"][0]["predicted"]


def test_knob_overrides_the_default_through_the_cli(cli):
    default = _predicted(cli)
    explicit = _predicted(cli, "--moe-imbalance", str(DEFAULT_IMBALANCE))
    even = _predicted(cli, "--moe-imbalance", "1.0")
    skewed = _predicted(cli, "--moe-imbalance", "1.6")
    assert explicit["step_time_s"] == pytest.approx(default["step_time_s"], rel=1e-12)
    a2a = [p["time_breakdown_s"]["moe_all_to_all"] for p in (even, default, skewed)]
    steps = [p["step_time_s"] for p in (even, default, skewed)]
    assert a2a == sorted(a2a) and len(set(a2a)) == 3
    assert steps == sorted(steps) and len(set(steps)) == 3


def test_knob_below_one_is_a_user_error(cli):
    code, out, err = cli("evaluate", *JOB, "--moe-imbalance", "0.9")
    assert code == 2
    assert err.strip().startswith("error:") and len(err.strip().splitlines()) == 1
