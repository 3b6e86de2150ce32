"""Published zero-bubble vs 1F1B throughput ratios (tests/bench/published_zb.toml, Qi et al.
2024) against planner's predictions: the file's schema and coverage, the transcription against
the paper's own summary figures, the model and layer-padding assumptions against closed forms,
and the ratio errors under bounds that record today's figures (docs/accuracy_pipelined.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cost.memory import total_param_count
from planner.errors import ConfigError
from planner.fidelity.zero_bubble import (
    BASELINE,
    PLANNER_SCHEDULE,
    build,
    by_setup,
    evaluate,
    load_pass_times,
    load_rows,
    model_spec,
    padded_stage_counts,
    pass_time_errors,
    row_name,
    summarize,
)

DATA = Path(__file__).parents[1] / "bench" / "published_zb.toml"

MEAN_ABS_RATIO_ERROR_BOUND = 0.035
"""All 66 ratios (Tables 4, 6 and 9): 3.4% today. Lower it as the model improves; never raise
it to let a change through."""
WORST_RATIO_ERROR_BOUND = 0.087
"""Worst ratio: 8.6% today (Table 9, 1.5B at m = p = 8, ZB-2p over-predicted)."""
TABLE4_ZB_MEAN_BOUND = 0.026
"""Table 4's 24 ZB-1p and ZB-2p ratios (the paper's main result): 2.5% today."""
TABLE4_ZB_WORST_BOUND = 0.053
"""Their worst: 5.2% today (28.3B, m 96, ZB-2p under-predicted)."""
PASS_TIME_BOUND = {"forward": (0.113, 0.183), "backward_input": (0.018, 0.039), "backward_weight": (0.082, 0.096)}
"""Mean and worst |predicted / profiled - 1| of each pass over the paper's 12 profiled setups,
today: forward 11.3% / 18.3% (all predicted fast), input gradient 1.7% / 3.9%, weight gradient
8.2% / 9.6% (all slow)."""


@pytest.fixture(scope="module")
def rows():
    return load_rows(DATA)


@pytest.fixture(scope="module")
def results(rows):
    return evaluate(rows, auto=False)


def test_file_covers_the_papers_tables(rows):
    groups = by_setup(rows)
    tables = {row.table.split(" (")[0] for row in rows}
    assert tables == {"Table 4", "Table 6", "Table 9"}
    assert len([s for s in groups if s.startswith("t4-")]) == 12  # 4 models x 3 micro-batch counts
    assert len([s for s in groups if s.startswith("t6-")]) == 9
    assert {r.schedule for r in rows} == set(PLANNER_SCHEDULE)
    for setup, group in groups.items():
        assert [r.schedule for r in group].count(BASELINE) == 1, setup
        assert all(r.url.startswith("https://arxiv.org/abs/2401.10241") for r in group)
        assert all(str(r.samples_per_gpu_per_s) in r.quote for r in group), setup


def test_transcription_matches_the_papers_headline_gains(rows):
    """The abstract: ZB beats 1F1B "up to 23% in throughput under a similar memory limit" (ZB-1p
    and ZB-V: Table 6, 28.3B, m 96, 1.01 / 0.82) and "up to 31% when the memory constraint is
    relaxed" (ZB-2p; Table 4's best is 0.99 / 0.76 = +30.3%, the abstract's "31%" rounds up)."""

    def best(table, schedules):
        return max(
            r.samples_per_gpu_per_s / next(b for b in group if b.schedule == BASELINE).samples_per_gpu_per_s
            for group in by_setup(rows).values()
            for r in group
            if r.schedule in schedules and r.table.startswith(table)
        )

    assert round(best("Table", {"ZB-1p", "ZB-V"}) - 1, 2) == 0.23
    assert round(best("Table 4", {"ZB-2p"}) - 1, 3) == 0.303


def test_every_setup_keeps_one_global_batch(rows):
    for setup, group in by_setup(rows).items():
        assert len({r.global_batch for r in group}) == 1, setup
        star = [r for r in group if r.schedule == "ZB-2p*"]
        base = next(r for r in group if r.schedule == BASELINE)
        for r in star:  # "microbatch size as b/2 and the number of microbatches as 2m"
            assert (2 * r.mbs, r.microbatches // 2) == (base.mbs, base.microbatches)


def test_vocabulary_gives_the_published_model_sizes(rows):
    sizes = {r.model: total_param_count(model_spec(r)) for r in rows}
    assert {name: round(count / 1e9, 1) for name, count in sizes.items()} == {
        "gpt-1.5b": 1.5,
        "gpt-6.2b": 6.2,
        "gpt-14.6b": 14.6,
        "gpt-28.3b": 28.3,
    }


@pytest.mark.parametrize(
    ("layers", "stages", "counts"),
    [
        (22, 8, [2, 3, 3, 3, 3, 3, 3, 2]),  # the paper: first and last stage one layer fewer
        (22, 24, [0] + [1] * 22 + [0]),  # 1F1B-I, one layer per chunk: end chunks hold none
        (62, 64, [0] + [1] * 62 + [0]),  # ZB-V, 28.3B on 32 GPUs
        (46, 16, [2] + [3] * 14 + [2]),
        (24, 8, [3] * 8),  # nothing to pad
    ],
)
def test_padding_takes_a_layer_from_each_end(layers, stages, counts):
    assert padded_stage_counts(layers, stages) == counts


def test_layouts_are_the_papers(rows):
    for row in rows:
        _, layout = build(row)
        assert (layout.tp, layout.dp, layout.pp) == (1, 1, row.gpus)
        per_rank = [sum(end - start for start, end in chunks) for chunks in layout.stage_layers]
        assert sum(per_rank) == row.layers
        if row.schedule in ("1F1B", "ZB-1p", "ZB-2p"):
            assert per_rank[0] == per_rank[-1] == max(per_rank) - 1


def test_bad_file_is_refused(tmp_path):
    text = DATA.read_text()
    first = text.index("[[row]]")
    second = text.index("[[row]]", first + 1)
    broken = tmp_path / "zb.toml"
    broken.write_text(text[:first] + text[second:])  # drops t4-1.5b-m24's 1F1B row
    with pytest.raises(ConfigError, match="t4-1.5b-m24"):
        load_rows(broken)
    broken.write_text(text.replace('schedule = "1F1B-I"', 'schedule = "1F1B-X"', 1))
    with pytest.raises(ConfigError, match="row #2"):
        load_rows(broken)


def test_predicted_order_of_schedules_matches_table_4(results):
    """Every Table 4 setup: ZB-2p > ZB-1p > 1F1B, as measured."""
    for setup, _group in by_setup([r.row for r in results]).items():
        if not setup.startswith("t4-"):
            continue
        ratio = {r.row.schedule: r.predicted_ratio for r in results if r.row.setup == setup}
        assert ratio["ZB-2p"] > ratio["ZB-1p"] > 1.0, setup


def test_ratio_errors_stay_within_todays(results):
    overall = summarize({row_name(r): r.ratio_error for r in results})
    assert overall.rows == 66
    assert overall.mean_abs <= MEAN_ABS_RATIO_ERROR_BOUND, overall
    assert overall.max_abs <= WORST_RATIO_ERROR_BOUND, overall
    main = [r for r in results if r.row.table == "Table 4" and r.row.schedule in ("ZB-1p", "ZB-2p")]
    table4 = summarize({row_name(r): r.ratio_error for r in main})
    assert table4.rows == 24
    assert table4.mean_abs <= TABLE4_ZB_MEAN_BOUND, table4
    assert table4.max_abs <= TABLE4_ZB_WORST_BOUND, table4


def test_pass_times_stay_within_todays(rows):
    published = load_pass_times(DATA)
    assert len(published) == 12 and {p.setup for p in published} == {s for s in by_setup(rows) if s.startswith("t4-")}
    results = pass_time_errors(rows, published)
    for field, (mean_bound, worst_bound) in PASS_TIME_BOUND.items():
        errors = [abs(getattr(r, field)) for r in results]
        assert sum(errors) / len(errors) <= mean_bound, (field, errors)
        assert max(errors) <= worst_bound, (field, errors)


def test_automatic_order_is_never_slower_than_the_hand_crafted_one(rows):
    """auto_zb at the paper's limit (ZB-1p: p, ZB-2p: 2p micro-batches) keeps ZB-H1 / ZB-H2 among
    its candidates, so on the same chunk costs its ratio is at least theirs."""
    setup = [r for r in rows if r.setup == "t4-1.5b-m24"]
    results = {r.row.schedule: r for r in evaluate(setup, auto=True)}
    for schedule in ("ZB-1p", "ZB-2p"):
        assert results[schedule].auto_ratio >= results[schedule].predicted_ratio * (1 - 1e-9), schedule
    assert results["1F1B-I"].auto_ratio is None
