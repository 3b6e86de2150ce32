"""Published training runs (tests/bench/published_runs.toml) against planner's predictions:
every row evaluates, the mean error stays under its recorded bound, and the FLOP accounting
agrees with closed forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.cost.memory import total_param_count
from planner.cost.shapes import model_flops_per_token
from planner.fidelity.published import (
    MFU_GOAL,
    build,
    evaluate_all,
    flops_per_token,
    load_runs,
    mean_abs_error,
    published_tokens_per_s_per_gpu,
)

DATA = Path(__file__).parents[1] / "bench" / "published_runs.toml"
MEAN_ERROR_BOUND = 0.22
"""Mean absolute relative error the model reaches today (0.211, docs/accuracy_published.md);
the goal is MFU_GOAL (0.15). Lower this bound as the model improves; never raise it."""


@pytest.fixture(scope="module")
def runs():
    return load_runs(DATA)


@pytest.fixture(scope="module")
def results(runs):
    return evaluate_all(runs)


def test_file_names_the_required_runs(runs):
    names = {r.name for r in runs}
    assert any(n.startswith("llama3-405b") for n in names)
    assert "bloom-176b" in names
    assert sum(n.startswith("torchtitan-") for n in names) >= 2
    for run in runs:
        assert run.source and run.url.startswith("https://") and len(run.assumptions) > 40


def test_every_run_builds_a_valid_layout(runs):
    for run in runs:
        _, layout = build(run)
        assert layout.num_gpus == run.gpus
        assert layout.dp * layout.mbs * layout.num_microbatches == run.global_batch


def test_every_run_predicts_finite_positive_numbers(results):
    for r in results:
        assert 0 < r.predicted_mfu < 1, r.run.name
        assert 0 < r.published_mfu < 1, r.run.name
        assert r.peak_memory_gib > 0


def test_mean_error_stays_under_recorded_bound(results):
    assert MEAN_ERROR_BOUND >= MFU_GOAL
    assert mean_abs_error(results) <= MEAN_ERROR_BOUND


def test_published_conversion_round_trips_stated_mfu(runs):
    """Where a source gives both TFLOP/s and MFU, they agree through the H100 peak."""
    for run in runs:
        if run.tflops_per_gpu is None or run.mfu is None:
            continue
        model, _ = build(run)
        peak = model.cluster.gpu.peak_flops("bf16")
        assert run.tflops_per_gpu * 1e12 / peak == pytest.approx(run.mfu, abs=0.01)
        from_tflops = published_tokens_per_s_per_gpu(run, model.spec, peak)
        assert from_tflops > 0


def test_palm_flops_match_six_n_plus_attention_closed_form():
    """6 * N_matmul + 12 L a d s, with N_matmul = all weights but the input embedding,
    against an independent count from the model's parameters (norm weights are < 0.01%)."""
    for name, seq in (("llama3-8b", 8192), ("llama3-405b", 8192), ("llama3-405b", 131072)):
        spec = resolve_model(name)
        n_matmul = total_param_count(spec) - spec.vocab_size * spec.hidden_size
        attention = 12 * spec.num_layers * spec.num_attention_heads * spec.kv_channels * seq
        assert model_flops_per_token(spec, seq) == pytest.approx(6 * n_matmul + attention, rel=1e-3)


def test_llama3_405b_palm_flops_against_paper_figures():
    """Llama 3 paper Table 4: 430 TFLOP/s per GPU on 8192 GPUs is 43% MFU; the same count
    makes 405B's 8K-token step ~2.6e12 FLOPs per token (6 x 405e9 = 2.43e12 + attention)."""
    spec = resolve_model("llama3-405b")
    per_token = model_flops_per_token(spec, 8192)
    assert 6 * 405e9 < per_token < 6 * 405e9 * 1.12


def test_megatron_hfu_is_four_thirds_of_model_flops_with_recompute():
    """Narayanan et al. eq. 3: the factor 4 (full recompute) over 3 counts one extra forward."""
    spec = resolve_model("bloom-176b")
    hfu = flops_per_token(spec, 2048, "megatron_hfu", "full")
    mfu = flops_per_token(spec, 2048, "megatron_hfu", "none")
    assert hfu / mfu == pytest.approx(4 / 3)
    # eq. 3 without recompute against 6N + attention (learned/ALiBi differences aside): within 2%
    assert mfu == pytest.approx(model_flops_per_token(spec, 2048), rel=0.02)


def test_bloom_published_tflops_convert_to_paper_scale_throughput(runs):
    """150 hardware TFLOP/s on 384 A100s is ~104 tokens/s per GPU: 2048 x 2048 tokens in
    ~105 s per step, as the tr11 README's days-left formula (105 s per iteration) assumes."""
    run = next(r for r in runs if r.name == "bloom-176b")
    model, _ = build(run)
    tps = published_tokens_per_s_per_gpu(run, model.spec, model.cluster.gpu.peak_flops("bf16"))
    step_s = run.global_batch * run.seq / (tps * run.gpus)
    assert step_s == pytest.approx(105, rel=0.03)
