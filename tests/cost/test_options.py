"""CostOptions by group, and by flat field name (`of`, `with_fields`, `flat`, `FIELD_GROUP`)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from planner.cost.model import CostOptions
from planner.cost.options import FIELD_GROUP


def test_flat_names_are_unique_across_the_groups():
    groups = {group.name: [field.name for field in fields(group.default)] for group in fields(CostOptions)}
    names = [name for members in groups.values() for name in members]
    assert len(names) == len(set(names)) == len(FIELD_GROUP)
    assert all(FIELD_GROUP[name] == group for group, members in groups.items() for name in members)


def test_of_routes_each_flat_name_to_its_group():
    options = CostOptions.of(attention="unfused", p2p_mode="blocking", moe_imbalance=1.5, stragglers=False)
    assert options.kernels.attention == "unfused" and not options.kernels.flash_attention
    assert options.pipeline.p2p_mode == "blocking"
    assert options.moe.moe_imbalance == 1.5
    assert options.cluster.stragglers is False
    assert options.tensor == CostOptions().tensor


def test_flat_round_trips():
    options = CostOptions.of(dtype="fp16", fsdp2=True, recompute_modules=("layernorm",), parameter_copies=2)
    assert set(options.flat()) == set(FIELD_GROUP)
    assert CostOptions.of(**options.flat()) == options
    assert CostOptions.of() == CostOptions()


def test_with_fields_replaces_only_the_named_fields():
    base = CostOptions.of(dropout=True, cp_comm="all_gather")
    changed = base.with_fields(attention="unfused", overlap_grad_reduce=False)
    assert changed.flat() == {**base.flat(), "attention": "unfused", "overlap_grad_reduce": False}


def test_an_unknown_name_is_refused_by_name():
    with pytest.raises(ValueError, match="flash_attention"):
        CostOptions.of(flash_attention=False)
    with pytest.raises(ValueError, match="no_such_option"):
        CostOptions().with_fields(no_such_option=1)


@pytest.mark.parametrize(
    "fields_",
    [
        {"p2p_mode": "sometimes"},
        {"moe_imbalance": 0.5},
        {"fsdp2": True, "fsdp1_grad_cat": True},
        {"parameter_copies": 0},
    ],
)
def test_each_group_checks_its_values(fields_):
    with pytest.raises(ValueError):
        CostOptions.of(**fields_)
