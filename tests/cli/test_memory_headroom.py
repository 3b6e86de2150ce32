"""Plans keep a share of the memory free for what the model under-predicts, and a calibration
from the user's logs carries its measured memory into the limit."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from planner.catalog import resolve_gpu
from planner.uncertainty import default_memory_headroom

H100_GIB = resolve_gpu("h100").memory_gib
REQUEST = ("--model", "llama3-70b", "--gpus", "1024", "--gpu", "h100", "--global-batch", "1024", "--seq", "8192")
"""The README's first request: its best plan without headroom uses nearly all of the memory."""
BEST_WITHOUT_HEADROOM = ("--tp", "4", "--pp", "4", "--vpp", "8", "--mbs", "1", "--schedule", "interleaved_1f1b")


def _json(cli, *argv):
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    return json.loads(out), err


def _peak(plan):
    return max(plan["predicted"]["memory_gb_per_stage"])


def test_default_headroom_is_the_largest_memory_under_prediction_of_the_development_set():
    rows = json.loads(resources.files("planner.presets").joinpath("residuals.json").read_text())["runs"]
    errors = [row["memory_error"] for row in rows if row["memory_error"] is not None]
    assert len(errors) >= 5 and min(errors) < 0  # the set under-predicts some runs' memory
    default = default_memory_headroom()
    assert default.share == pytest.approx(-min(errors), abs=5e-4)
    assert default.runs == len(errors)


@pytest.fixture(scope="module")
def plans(request):
    """The README request's plans with the default headroom and with none."""
    from planner.api import plan
    from planner.request import Request

    base = dict(model="llama3-70b", gpu="h100", num_gpus=1024, global_batch=1024, seq=8192)
    return plan(Request(**base)), plan(Request(**base, memory_headroom=0.0))


def test_plans_keep_the_headroom_free_and_say_so(plans):
    kept, unkept = plans
    share = default_memory_headroom().share
    limit = H100_GIB * (1 - share)
    assert kept.cluster.memory_headroom == share
    assert kept.cluster.memory_limit_gb == pytest.approx(limit, abs=1e-3)
    assert all(max(p.predicted.memory_gb_per_stage) <= limit + 1e-3 for p in kept.plans)
    # without it the best plan is the one that sits in the margin: the headroom changed the answer
    assert max(unkept.plans[0].predicted.memory_gb_per_stage) > limit
    assert unkept.plans[0].predicted.step_time_s < kept.plans[0].predicted.step_time_s


def test_the_plan_output_states_the_headroom_and_where_it_comes_from(cli):
    code, out, err = cli("plan", *REQUEST, "--top", "1")
    assert code == 0, err
    share = default_memory_headroom().share
    assert f"plans use at most {H100_GIB * (1 - share):.1f} of {H100_GIB:.1f} GiB per GPU" in out
    assert f"{share:.1%} headroom" in out and default_memory_headroom().worst_run in out
    code, out, err = cli("plan", *REQUEST, "--top", "1", "--memory-headroom", "0.2")
    assert code == 0 and f"at most {H100_GIB * 0.8:.1f} of" in out and "(20.0% headroom: --memory-headroom)" in out


def test_evaluate_warns_of_a_layout_within_the_headroom(cli):
    document, err = _json(cli, "evaluate", *REQUEST, *BEST_WITHOUT_HEADROOM)
    peak = _peak(document["plans"][0])
    assert H100_GIB * (1 - default_memory_headroom().share) < peak < H100_GIB
    assert "within the" in err and "headroom" in err and "may run out of memory" in err
    _, err = _json(cli, "evaluate", *REQUEST, *BEST_WITHOUT_HEADROOM, "--memory-headroom", "0")
    assert "warning" not in err
    _, err = _json(cli, "evaluate", *REQUEST, *BEST_WITHOUT_HEADROOM, "--max-memory-gb", "60")
    assert "over the 60.0 GiB it has: this layout runs out of memory" in err


@pytest.mark.parametrize("share", ["-0.1", "0.6"])
def test_a_headroom_outside_0_to_half_is_refused_in_one_line(cli, share):
    code, _, err = cli("plan", *REQUEST, "--memory-headroom", share)
    assert code != 0 and "--memory-headroom" in err and len(err.strip().splitlines()) == 1


def test_a_calibrations_memory_scale_divides_the_limit(cli, tmp_path):
    from planner.calibration.schema import CalibrationFile, ClusterEntry, save

    gpu = resolve_gpu("h100")
    path = tmp_path / "calibration.json"
    save(
        path,
        CalibrationFile(
            gpu=gpu.name,
            cluster=ClusterEntry(gpu=gpu.name, gpus_per_node=8, num_gpus=[8]),
            knobs=[],
            fields={},
            efficiency=gpu.efficiency,
            residuals=[],
            rms_error_before_pct=0.0,
            rms_error_after_pct=0.0,
            runs=[],
            memory_scale=1.25,
        ),
    )
    document, _ = _json(cli, "plan", *REQUEST, "--top", "2", "--calibration", str(path))
    limit = H100_GIB * (1 - default_memory_headroom().share) / 1.25
    assert document["cluster"]["memory_limit_gb"] == pytest.approx(limit, abs=1e-3)
    assert all(_peak(p) <= limit + 1e-3 for p in document["plans"])
