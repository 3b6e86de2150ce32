"""`planner calibrate --from-log ... --plan ...` and `plan/evaluate/sweep --calibration FILE`,
on a published torchtitan log (tests/data/logs/SOURCES.md) and on synthetic ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.calibration.schema import load
from planner.catalog import resolve_model
from planner.cost.shapes import model_flops_per_token
from planner.plan import parse_plan_file
from tests.calibration.logmaker import megatron_log

LOGS = Path(__file__).parents[1] / "data" / "logs"
TITAN_LOG = LOGS / "torchtitan_pr1287_llama3_8b.log"
# The layout of that log: Llama 3 8B at seq 8192 on H100 96 GB (from its own tflops/tps and
# memory/percent), torchtitan's default llama3_8b.toml: FSDP on 8 GPUs, local batch 1, selective AC.
TITAN_RUN = [
    "--model",
    "llama3-8b",
    "--gpus",
    "8",
    "--gpu",
    "h100-96gb",
    "--global-batch",
    "8",
    "--seq",
    "8192",
    "--mbs",
    "1",
    "--zero",
    "3",
    "--recompute",
    "selective",
    "--runtime",
    "torchtitan",
]


def _evaluate(cli, argv, *extra):
    code, out, err = cli("evaluate", *argv, *extra, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def titan_plan(cli, tmp_path):
    path = tmp_path / "plan.json"
    _evaluate(cli, TITAN_RUN, "-o", str(path))
    return path


def test_calibrate_a_published_torchtitan_log(cli, tmp_path, titan_plan):
    out = tmp_path / "calibration.json"
    code, stdout, err = cli("calibrate", "--from-log", str(TITAN_LOG), "--plan", str(titan_plan), "-o", str(out))
    assert code == 0, err
    assert "compute" in stdout and f"wrote {out}" in stdout
    calibration = load(out)
    assert calibration.schema_version == 1 and calibration.gpu == "h100-96gb"
    assert calibration.cluster.num_gpus == [8] and calibration.cluster.gpus_per_node == 8
    (residual,) = calibration.residuals
    assert residual.measured_step_time_s == pytest.approx(8192 / 5864)  # median tps of steps 210-250
    assert abs(residual.error_after_pct) < 1 < abs(residual.error_before_pct)
    assert calibration.rms_error_before_pct == pytest.approx(abs(residual.error_before_pct))
    assert calibration.rms_error_after_pct < 1
    assert residual.memory.measured_max_reserved_gib == 49.66
    # memory carries over: the log's max reserved over the predicted one, which plans are then held to
    measured_over_predicted = 49.66 / residual.memory.predicted_reserved_gib
    assert residual.memory.error_pct == pytest.approx(100 * (1 / measured_over_predicted - 1))
    assert calibration.memory_scale == pytest.approx(max(1.0, measured_over_predicted), abs=1e-4)
    knobs = {k.name: k for k in calibration.knobs}
    assert knobs["compute"].fitted and not knobs["comm"].fitted and not knobs["overhead"].fitted
    low, high = knobs["compute"].bounds
    assert low <= knobs["compute"].value <= high
    assert calibration.fields["gemm"].value == pytest.approx(calibration.fields["gemm"].prior * knobs["compute"].value)
    (run,) = calibration.runs
    assert run.format == "torchtitan" and run.plan.zero_stage == 3 and run.plan.seq == 8192
    assert run.steps_used == [210, 220, 230, 240, 250] and len(run.log_sha256) == 64

    # evaluate --calibration predicts the measured step time for that layout, and says so
    document = _evaluate(cli, TITAN_RUN, "--calibration", str(out))
    assert document["cost_source"] == "analytic, calibrated from 1 run"
    assert document["plans"][0]["predicted"]["step_time_s"] == pytest.approx(8192 / 5864, rel=0.01)


def test_plan_and_sweep_use_the_calibration(cli, tmp_path, titan_plan):
    out = tmp_path / "calibration.json"
    assert cli("calibrate", "--from-log", str(TITAN_LOG), "--plan", str(titan_plan), "-o", str(out))[0] == 0
    argv = [
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--gpu",
        "h100-96gb",
        "--global-batch",
        "8",
        "--seq",
        "8192",
        "--tp",
        "1",
        "--pp",
        "1",
        "--mbs",
        "1",
    ]
    code, plain, err = cli("plan", *argv, "--json")
    assert code == 0, err
    code, calibrated, err = cli("plan", *argv, "--calibration", str(out), "--json")
    assert code == 0, err
    before, after = json.loads(plain), json.loads(calibrated)
    assert before["cost_source"] == "analytic" and after["cost_source"] == "analytic, calibrated from 1 run"
    # a slower fitted compute efficiency makes the best plan slower
    assert after["plans"][0]["predicted"]["step_time_s"] > before["plans"][0]["predicted"]["step_time_s"]
    code, text, err = cli("plan", *argv, "--calibration", str(out))
    assert code == 0 and "calibrated from 1 run" in text
    code, swept, err = cli(
        "sweep",
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-96gb",
        "--global-batch",
        "8",
        "--seq",
        "8192",
        "--vary",
        "gpus",
        "--values",
        "8",
        "--calibration",
        str(out),
        "--json",
    )
    assert code == 0, err
    assert json.loads(swept)["cost_source"] == "analytic, calibrated from 1 run"


def test_calibration_of_another_gpu_is_refused(cli, tmp_path, titan_plan):
    out = tmp_path / "calibration.json"
    assert cli("calibrate", "--from-log", str(TITAN_LOG), "--plan", str(titan_plan), "-o", str(out))[0] == 0
    code, _, err = cli("evaluate", *TITAN_RUN[:5], "h100", *TITAN_RUN[6:], "--calibration", str(out))
    assert code == 2 and "describes GPU h100-96gb, but --gpu is h100" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": 1}')
    code, _, err = cli("evaluate", *TITAN_RUN, "--calibration", str(broken))
    assert code == 2 and err.startswith("error: calibration file")


def test_two_synthetic_megatron_runs_fit_compute_and_comm(cli, tmp_path):
    # Runs of two layouts whose "measured" times are the planner's own prediction with its
    # efficiencies scaled: compute x 0.85 and communication x 0.6 (through a first calibration
    # file that sets exactly those factors, applied with evaluate --calibration).
    layouts = {
        "dp8": ["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--global-batch", "64", "--seq", "8192"],
        "tp16": [
            "--model",
            "llama3-8b",
            "--gpus",
            "16",
            "--gpu",
            "h100",
            "--global-batch",
            "16",
            "--seq",
            "8192",
            "--tp",
            "16",
        ],
    }
    truth = _truth_file(tmp_path, {"compute": 0.85, "comm": 0.6})
    args = []
    for name, argv in layouts.items():
        plan_path = tmp_path / f"{name}.json"
        _evaluate(cli, argv, "-o", str(plan_path))
        true = _evaluate(cli, argv, "--calibration", str(truth))["plans"][0]["predicted"]
        log = tmp_path / f"{name}.log"
        gpus, tokens = int(argv[3]), int(argv[7]) * int(argv[9])
        tflops = model_flops_per_token(resolve_model("llama3-8b"), int(argv[9])) * tokens / true["step_time_s"] / gpus
        log.write_text(
            megatron_log(
                true["step_time_s"], tflops / 1e12, int(argv[7]), {0: max(true["memory_reserved_gb_per_stage"]) * 1024}
            )
        )
        args += ["--from-log", str(log), "--plan", str(plan_path)]
    code, out, err = cli("calibrate", *args, "--json")
    assert code == 0 and "warning" not in err, err
    document = json.loads(out)
    knobs = {k["name"]: k for k in document["knobs"]}
    assert knobs["compute"]["value"] == pytest.approx(0.85, rel=5e-3)
    assert knobs["comm"]["fitted"] and knobs["comm"]["value"] == pytest.approx(0.6, rel=5e-3)
    assert not knobs["overhead"]["fitted"]
    assert all(abs(r["error_after_pct"]) < 0.2 for r in document["residuals"])
    assert all(abs(r["memory"]["error_pct"]) < 0.1 for r in document["residuals"])
    assert document["memory_scale"] == pytest.approx(1.0, abs=2e-3)


def _truth_file(tmp_path, factors):
    """A calibration file whose efficiency is the h100 prior scaled by `factors`."""
    from planner.calibration.fit import apply
    from planner.calibration.schema import CalibrationFile, ClusterEntry, save
    from planner.catalog import resolve_gpu

    efficiency = apply(resolve_gpu("h100").efficiency, factors, "synthetic truth")
    path = tmp_path / "truth.json"
    save(
        path,
        CalibrationFile(
            gpu="h100",
            cluster=ClusterEntry(gpu="h100", gpus_per_node=8, num_gpus=[8]),
            knobs=[],
            fields={},
            efficiency=efficiency.model_dump(),
            residuals=[],
            rms_error_before_pct=0.0,
            rms_error_after_pct=0.0,
            runs=[],
        ),
    )
    return path


def test_user_errors(cli, tmp_path, titan_plan):
    code, _, err = cli("calibrate", "--from-log", str(TITAN_LOG))
    assert code == 2 and "one --plan per --from-log" in err
    code, _, err = cli("calibrate")
    assert code == 2 and "--from-log LOG --plan PLAN" in err
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    code, _, err = cli("calibrate", "--from-log", str(empty), "--plan", str(titan_plan))
    assert code == 2 and "no training progress lines" in err
    bare = tmp_path / "bare.json"
    bare.write_text(parse_plan_file(titan_plan.read_text()).model_copy(update={"model": None}).model_dump_json())
    code, _, err = cli("calibrate", "--from-log", str(TITAN_LOG), "--plan", str(bare))
    assert code == 2 and "has no model or cluster" in err


def test_a_plan_that_is_not_the_logs_run(cli, tmp_path, titan_plan):
    # Megatron-LM prints the global batch it trains: the Mixtral excerpt's 128 is not the plan's 8.
    code, _, err = cli(
        "calibrate", "--from-log", str(LOGS / "megatron_issue756_mixtral_run2.log"), "--plan", str(titan_plan)
    )
    assert code == 2 and "the log trains global batch 128" in err
    # torchtitan's tflops / tps is the FLOPs per token of the model at its sequence length:
    # 57.9 GFLOP for Llama 3 8B at 8192, not the 51.5 GFLOP of seq 4096 (6 x 7.505e9 matmul weights
    # + 12 x 32 layers x 4096 x 4096).
    short = tmp_path / "short.json"
    _evaluate(cli, [*TITAN_RUN[:9], "4096", *TITAN_RUN[10:]], "-o", str(short))
    code, _, err = cli("calibrate", "--from-log", str(TITAN_LOG), "--plan", str(short))
    assert code == 0, err
    assert "warning:" in err and "implies 57.9 GFLOP per token" in err and "has 51.5" in err
    code, _, err = cli("calibrate", "--from-log", str(TITAN_LOG), "--plan", str(titan_plan))
    assert code == 0 and "warning" not in err


def test_runs_of_two_gpus_are_refused(cli, tmp_path, titan_plan):
    other = tmp_path / "h100.json"
    _evaluate(cli, [*TITAN_RUN[:5], "h100", *TITAN_RUN[6:]], "-o", str(other))
    code, _, err = cli(
        "calibrate",
        "--from-log",
        str(TITAN_LOG),
        "--plan",
        str(titan_plan),
        "--from-log",
        str(TITAN_LOG),
        "--plan",
        str(other),
    )
    assert code == 2 and "one GPU at a time" in err and "h100, h100-96gb" in err
