"""The schedule table is the one list of schedules: the plan contract names the same ones."""

from __future__ import annotations

from typing import get_args

from planner.plan import ScheduleName
from planner.schedule import SCHEDULES


def test_the_plan_contract_names_the_registry_schedules():
    assert get_args(ScheduleName) == tuple(SCHEDULES)


def test_schedules_no_runtime_runs_are_neither_searched_by_default_nor_torch_classes():
    for info in SCHEDULES.values():
        if info.simulated_only is not None:
            assert not info.searched_by_default and info.torch_name is None, info.name
