"""Parsing training logs: published excerpts (tests/data/logs, sources in SOURCES.md) read by
hand, and the variants the runtimes print (colour codes, prefixes, several ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.calibration.logs import detect_format, parse_log, steady_state
from planner.errors import PlannerError

LOGS = Path(__file__).parents[1] / "data" / "logs"


def _log(name: str):
    return parse_log((LOGS / name).read_text())


def test_torchtitan_published_excerpt():
    log = _log("torchtitan_pr1287_llama3_8b.log")
    assert log.format == "torchtitan"
    assert [s.step for s in log.steps] == [200, 210, 220, 230, 240, 250]  # GC / profiler lines ignored
    assert [s.tokens_per_s_per_gpu for s in log.steps] == [5856, 5593, 5868, 5869, 5864, 5862]
    assert log.steps[0].tflops_per_gpu == 339.16 and log.steps[0].mfu == pytest.approx(0.3429)
    assert log.steps[0].reserved_gib == 49.66 and log.steps[0].memory_fraction == pytest.approx(0.5228)
    measured = steady_state(log)
    assert measured.steps_used == (210, 220, 230, 240, 250)  # the first report is warm-up
    assert measured.tokens_per_s_per_gpu == 5864  # median of 5593 5868 5869 5864 5862
    assert measured.tflops_per_gpu == 339.59 and measured.max_reserved_gib == 49.66
    assert measured.max_allocated_gib is None
    # FSDP on 8 GPUs, local batch 1 x 8192 tokens: 8 x 8192 tokens a step at 5864 tokens/s/GPU
    assert measured.step_time_for(8 * 8192, 8) == pytest.approx(8192 / 5864)


def test_torchtitan_every_rank_printing_keeps_one_report_per_step():
    log = _log("torchtitan_pr2389_all_ranks.log")
    assert [s.step for s in log.steps] == [4, 5]
    assert log.steps[0].tokens_per_s_per_gpu == 10050 and log.steps[0].tflops_per_gpu == 314.71
    assert log.steps[1].tokens_per_s_per_gpu == 10007 and log.steps[1].reserved_gib == 66.91


def test_megatron_published_excerpt_with_timestamps_and_throughput():
    log = _log("megatron_issue756_mixtral_run1.log")
    assert log.format == "megatron"
    assert [(s.step, s.step_time_s, s.tflops_per_gpu) for s in log.steps] == [
        (10, 9.4964, 137.5),
        (11, 10.0369, 130.1),
        (12, 10.1984, 128.1),
    ]
    measured = steady_state(log)
    assert measured.steps_used == (11, 12)
    assert measured.step_time_s == pytest.approx((10.0369 + 10.1984) / 2)
    assert measured.tflops_per_gpu == pytest.approx(129.1)
    assert measured.max_reserved_gib is None and measured.global_batch == 128
    later = steady_state(_log("megatron_issue756_mixtral_run2.log"))
    assert later.step_time_s == pytest.approx((5.4707 + 5.8299) / 2)
    # skip_steps=0 keeps the first report too: median of 5361.6 5470.7 5829.9 ms
    assert steady_state(_log("megatron_issue756_mixtral_run2.log"), skip_steps=0).step_time_s == 5.4707


def test_megatron_legacy_format_and_memory_line():
    log = _log("megatron_issue60_gpt2_legacy.log")
    assert [(s.step, s.step_time_s) for s in log.steps] == [(5, 16.4915), (10, 1.9939), (15, 1.9781)]
    (memory,) = log.memory
    assert (memory.rank, memory.iteration) == (None, 5)
    assert memory.max_allocated_mib == pytest.approx(12606.062) and memory.max_reserved_mib == 17482.0
    measured = steady_state(log)
    assert measured.step_time_s == pytest.approx((1.9939 + 1.9781) / 2)
    assert measured.max_allocated_gib == pytest.approx(12606.062 / 1024)
    assert measured.max_reserved_gib == pytest.approx(17482.0 / 1024)
    assert measured.global_batch is None  # not printed by that release


def test_megatron_current_format_variants():
    text = "\n".join(
        [
            "[default0]: [2025-05-27 15:23:07] iteration        1/    24000 | consumed samples:  1024 | "
            "elapsed time per iteration (ms): 271607.0 | throughput per GPU (TFLOP/s/GPU): 40.4 |",
            "[default0]: [2025-05-27 15:24:07] iteration        2/    24000 | consumed samples:  2048 | "
            "elapsed time per iteration (ms): 5361.6/5402.3 | throughput per GPU (TFLOP/s/GPU): 243.6 |",
            "[Rank 3] (after 2 iterations) memory (MB) | allocated: 100.5 | max allocated: 2048.0 | "
            "reserved: 3000.0 | max reserved: 3072.0",
            "[Rank 0] (after 2 iterations) memory (MB) | allocated: 100.5 | max allocated: 1024.0 | "
            "reserved: 2000.0 | max reserved: 2048.0",
        ]
    )
    log = parse_log(text)
    assert [(s.step, s.step_time_s) for s in log.steps] == [(1, 271.607), (2, 5.3616)]  # the interval's own time
    assert sorted(m.rank for m in log.memory) == [0, 3]
    measured = steady_state(log)
    assert measured.max_allocated_gib == 2.0 and measured.max_reserved_gib == 3.0  # the fullest rank


def test_torchtitan_colour_codes_and_old_wps_field():
    coloured = (
        "\x1b[31mstep:  1  \x1b[32mloss: 10.5000  \x1b[36mmemory: 12.00GiB(15.00%)  "
        "\x1b[34mtps: 1,234  \x1b[96mtflops: 70.00  \x1b[35mmfu: 7.00%\x1b[39m"
    )
    old = (
        "2024-05-01 10:00:00,000 - root - INFO - step: 10  loss: 9.1234  memory: 12.50GiB(15.80%)  "
        "wps: 2,000  mfu: 9.10%"
    )
    log = parse_log(coloured + "\n" + old + "\n")
    assert [(s.step, s.tokens_per_s_per_gpu, s.mfu) for s in log.steps] == [(1, 1234, 0.07), (10, 2000, 0.091)]
    assert log.steps[1].tflops_per_gpu is None
    assert steady_state(log).max_reserved_gib == 12.5


def test_no_progress_lines_and_nothing_after_warmup():
    with pytest.raises(PlannerError, match="no training progress lines"):
        detect_format("hello\nworld\n")
    log = _log("megatron_issue756_mixtral_run1.log")
    with pytest.raises(PlannerError, match="at or before step 12"):
        steady_state(log, skip_steps=12)
