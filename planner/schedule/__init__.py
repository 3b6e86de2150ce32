"""Pipeline schedules as data, their event simulation, automatic zero-bubble scheduling and
timeline rendering.

    order = generate("zb_h1", pp=4, num_microbatches=8)          # rank -> [Action, ...]
    result = simulate(order, StageCosts.uniform(4, 1, f=1e-3, i=1e-3, w=1e-3))
    result.step_time_s, result.bubble_fraction, result.peak_inflight

Search loops re-cost one shape many times: `simulate(compile_schedule(name, P, M, V), costs)`.
"""

from planner.schedule.actions import (
    Action,
    ActionType,
    PipelineOrder,
    format_order,
    from_csv,
    rank_stages,
    stage_to_rank,
    to_csv,
)
from planner.schedule.auto_zb import auto_zero_bubble
from planner.schedule.closed_form import bubble_closed_form, zb_h1_idle_time
from planner.schedule.comms import add_send_recv, check_send_recv, compute_only
from planner.schedule.costs import StageCosts
from planner.schedule.exchanges import ExchangeProgram
from planner.schedule.registry import (
    SCHEDULES,
    TORCH_SCHEDULE_CLASS,
    ScheduleInfo,
    check_shape,
    generate,
    head_rank,
    schedule_info,
    virtual_stage,
)
from planner.schedule.simulate import (
    CompiledSchedule,
    SimResult,
    TimelineEntry,
    compile_order,
    compile_schedule,
    generated_order,
    peak_held_counts,
    simulate,
)
from planner.schedule.validate import OrderInfo, check_order
from planner.schedule.zb_ilp import optimal_schedule

__all__ = [
    "SCHEDULES",
    "TORCH_SCHEDULE_CLASS",
    "Action",
    "ActionType",
    "CompiledSchedule",
    "ExchangeProgram",
    "OrderInfo",
    "PipelineOrder",
    "ScheduleInfo",
    "SimResult",
    "StageCosts",
    "TimelineEntry",
    "add_send_recv",
    "auto_zero_bubble",
    "bubble_closed_form",
    "check_order",
    "check_send_recv",
    "check_shape",
    "head_rank",
    "compile_order",
    "compile_schedule",
    "compute_only",
    "format_order",
    "from_csv",
    "generate",
    "generated_order",
    "optimal_schedule",
    "peak_held_counts",
    "rank_stages",
    "schedule_info",
    "simulate",
    "stage_to_rank",
    "to_csv",
    "virtual_stage",
    "zb_h1_idle_time",
]
