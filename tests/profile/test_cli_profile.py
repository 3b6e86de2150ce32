"""`planner profile` and `planner calibrate` end to end on CPU: the file, resume after an
interruption, out-of-memory shapes, user errors, torch staying optional, collectives."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from planner.cli.app import run
from planner.profile import store
from planner.profile.schema import shape_keys

FAST = ["--dtype", "fp32", "--device", "cpu", "--warmup", "0", "--repeats", "1"]


class Crash(Exception):
    """A failure in the middle of a run (the process dying, as far as the file can tell)."""


class Recorder:
    """The shapes measured, the call (1-based) at which to interrupt the run, and what it raises then."""

    def __init__(self):
        self.calls: list = []
        self.fail_at: int | None = None
        self.failure: type[BaseException] = Crash


@pytest.fixture
def counted(monkeypatch):
    """Record measured shapes; check the file is a valid profile after every write."""
    pytest.importorskip("torch")
    import planner.profile.measure as measure

    recorder, real_measure, real_save = Recorder(), measure.measure_shape, store.save

    def measure_shape(spec, key, settings):
        recorder.calls.append(key)
        if len(recorder.calls) == recorder.fail_at:
            raise recorder.failure
        return real_measure(spec, key, settings)

    def save(path, profile):
        real_save(path, profile)
        assert store.load(path) == profile

    monkeypatch.setattr(measure, "measure_shape", measure_shape)
    monkeypatch.setattr(store, "save", save)
    return recorder


def test_profile_writes_every_shape(cli, tmp_path, one_thread, counted):
    path = tmp_path / "gpt.json"
    code, out, err = cli(
        "profile",
        "--model",
        "tiny-gpt",
        "--tp",
        "1,2",
        "--mbs",
        "1,2",
        "--seq",
        "32",
        "--recompute",
        "none,full",
        *FAST,
        "-o",
        str(path),
    )
    assert code == 0, err
    profile = store.load(path)
    keys = shape_keys(["embedding", "transformer", "head"], [1, 2], [1, 2], [32], ["none", "full"])
    assert [r.key for r in profile.rows] == keys == counted.calls
    assert all(r.status == "ok" for r in profile.rows)
    assert (profile.model.name, profile.device_type, profile.dtype, profile.repeats) == ("tiny-gpt", "cpu", "fp32", 1)
    assert "16 shapes (16 ok); 0 were already in" in out


def test_resume_after_an_interruption_measures_only_the_rest(cli, tmp_path, one_thread, counted):
    path = tmp_path / "llama.json"
    argv = ["profile", "--model", "tiny-llama", "--tp", "1,2", "--mbs", "1,2", "--seq", "32", *FAST, "-o", str(path)]
    counted.fail_at = 5
    with pytest.raises(Crash):
        run(argv)
    assert len(store.load(path).rows) == 4
    counted.calls.clear()
    counted.fail_at = None
    code, out, err = cli(*argv, "--resume")
    assert code == 0, err
    keys = shape_keys(["embedding", "transformer", "head"], [1, 2], [1, 2], [32], ["none"])
    assert counted.calls == keys[4:]
    assert sorted(r.key for r in store.load(path).rows) == sorted(keys)
    assert "4 were already in" in out


def test_ctrl_c_keeps_the_measured_shapes_and_prints_the_command_that_resumes(
    cli, tmp_path, one_thread, counted, monkeypatch
):
    """Ctrl-C during the second shape: exit 130, the first shape in the file, and one line on
    stderr whose command (the one typed, shell-quoted, plus --resume) measures only the rest."""
    path = tmp_path / "my profiles" / "llama.json"
    argv = ["profile", "--model", "tiny-llama", "--kinds", "transformer", "--mbs", "1,2,4", "--seq", "32"]
    argv += [*FAST, "-o", str(path)]
    monkeypatch.setattr(sys, "argv", ["/opt/venv/bin/planner", *argv])
    counted.fail_at, counted.failure = 2, KeyboardInterrupt
    code, _, err = cli(*argv)
    assert code == 130, err
    keys = shape_keys(["transformer"], [1], [1, 2, 4], [32], ["none"])
    assert [r.key for r in store.load(path).rows] == keys[:1]
    [line] = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert line.startswith(f"interrupted: 1 of 3 shapes measured are in {path}; resume with: planner profile ")
    command = shlex.split(line.partition("resume with: ")[2])
    assert command == ["planner", *argv, "--resume"]
    counted.calls.clear()
    counted.fail_at = None
    code, out, err = cli(*command[1:])
    assert code == 0, err
    assert counted.calls == keys[1:]
    assert [r.key for r in store.load(path).rows] == keys
    assert "1 were already in" in out


def test_resume_with_a_wider_grid_adds_the_missing_shapes(cli, tmp_path, one_thread, counted):
    path = tmp_path / "llama.json"
    base = ["profile", "--model", "tiny-llama", "--kinds", "transformer,head", "--seq", "32", *FAST, "-o", str(path)]
    assert cli(*base, "--mbs", "1")[0] == 0
    counted.calls.clear()
    assert cli(*base, "--mbs", "1,2", "--resume")[0] == 0
    assert [(k.kind, k.mbs) for k in counted.calls] == [("transformer", 2), ("head", 2)]


def test_out_of_memory_shapes_are_recorded_and_the_run_goes_on(cli, tmp_path, one_thread):
    path = tmp_path / "capped.json"
    code, out, err = cli(
        "profile",
        "--model",
        "tiny-llama",
        "--kinds",
        "transformer",
        "--mbs",
        "1,8",
        "--seq",
        "32,256",
        "--memory-cap-gb",
        "0.012",
        *FAST,
        "-o",
        str(path),
    )
    assert code == 0, err
    status = {(r.mbs, r.seq): r.status for r in store.load(path).rows}
    assert status == {(1, 32): "ok", (8, 32): "ok", (1, 256): "ok", (8, 256): "oom"}
    assert store.load(path).memory_cap_bytes == round(0.012 * 2**30)
    assert "1 oom" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tp", "1,x"], "--tp takes comma-separated integers"),
        (["--tp", "3"], "tp 3 does not divide the 4 attention heads"),
        (["--kinds", "mlp"], "--kinds: unknown 'mlp'"),
        (["--recompute", "selective"], "--recompute: unknown 'selective'"),
        (["--dtype", "int8"], "--dtype: unknown 'int8'"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--resume"], "does not exist"),
        (["--block", "tvm"], "--block: unknown 'tvm'"),
        (["--block", "megatron", "--device", "cpu"], "needs --device cuda"),
    ],
)
def test_user_errors_are_one_line(cli, tmp_path, argv, message):
    pytest.importorskip("torch")
    code, out, err = cli("profile", "--model", "tiny-llama", *argv, "-o", str(tmp_path / "x.json"))
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_existing_file_and_mismatched_resume_are_refused(cli, tmp_path, cpu_profile):
    code, _, err = cli("profile", "--model", "tiny-llama", *FAST, "-o", str(cpu_profile))
    assert code == 2 and "exists: pass --resume" in err
    code, _, err = cli(
        "profile",
        "--model",
        "tiny-llama",
        "--resume",
        "--dtype",
        "bf16",
        "--device",
        "cpu",
        "--warmup",
        "1",
        "--repeats",
        "3",
        "-o",
        str(cpu_profile),
    )
    assert code == 2 and "has dtype 'fp32', this run 'bf16'" in err
    code, _, err = cli("profile", "--model", "tiny-gpt", "--seq", "32", "--resume", *FAST, "-o", str(cpu_profile))
    assert code == 2 and "measured for model 'tiny-llama', not for 'tiny-gpt'" in err


def test_learned_positions_bound_the_sequence(cli, tmp_path):
    pytest.importorskip("torch")
    code, _, err = cli("profile", "--model", "tiny-gpt", "--seq", "1024", *FAST, "-o", str(tmp_path / "g.json"))
    assert code == 2 and "exceeds the 512 learned positions" in err


def test_calibrate_prints_the_preset_table(cli, cpu_profile):
    code, out, err = cli("calibrate", str(cpu_profile), "--gpu", "h100", "--to", "h200")
    assert code == 0, err
    toml = out[out.index("[h100.efficiency]") : out.index("[h200.efficiency]")]
    table = tomllib.loads(toml)["h100"]["efficiency"]
    assert {"gemm", "gemm_half_dim", "attention_fwd", "attention_bwd", "hbm", "kernel_overhead_us"} <= set(table)
    assert "fitted by planner calibrate to cpu-tiny-llama.json" in table["source"]
    assert "fractions of datasheet peak" in out


def test_calibrate_json(cli, cpu_profile):
    code, out, _ = cli("calibrate", str(cpu_profile), "--gpu", "h100", "--json")
    result = json.loads(out)
    assert code == 0 and result["error_after_pct"] < result["error_before_pct"]
    assert {p["kind"] for p in result["parts"]} == {"embedding", "transformer", "head"}
    assert result["transferred"] is None


def test_calibrate_refuses_a_bad_profile(cli, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 1}')
    code, _, err = cli("calibrate", str(path))
    assert code == 2 and "field 'device'" in err


def test_every_other_command_works_without_torch():
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from planner.cli.app import run\n"
        "import planner.cli, planner.profile.lookup, planner.cost.calibrate\n"
        "try:\n    run(['models'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "run(['profile', '--model', 'tiny-llama', '-o', 'never.json'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Built-in models" in done.stdout
    assert done.stderr.strip() == "error: planner profile needs torch: pip install torch (the 'torch' extra)"


ALL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
BUS_FACTOR_2 = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5, "send_recv": 1.0}


@pytest.mark.slow
def test_collectives_under_torchrun(tmp_path):
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    path = tmp_path / "comm.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "planner",
            "profile",
            "--collectives",
            "--model",
            "tiny-llama",
            "--device",
            "cpu",
            "--max-bytes",
            "4096",
            "--warmup",
            "1",
            "--repeats",
            "2",
            "-o",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = store.load(path).collectives
    assert {(r.op, r.bytes) for r in rows} == {(op, size) for op in ALL_OPS for size in (1024, 4096)}
    assert all(r.world_size == 2 and r.backend == "gloo" and r.time_us > 0 for r in rows)
    assert {r.op: r.busbw_gbps / r.algbw_gbps for r in rows if r.bytes == 4096} == pytest.approx(BUS_FACTOR_2)


@pytest.mark.slow
def test_collectives_spawn_their_own_processes_for_each_group_size(tmp_path):
    # no torchrun: `--nproc 4` starts 4 gloo processes and measures groups of 2 and 4
    pytest.importorskip("torch")
    path = tmp_path / "comm.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "profile",
            "--collectives",
            "--nproc",
            "4",
            "--model",
            "tiny-llama",
            "--device",
            "cpu",
            "--max-bytes",
            "16384",
            "--warmup",
            "1",
            "--repeats",
            "2",
            "-o",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = store.load(path).collectives
    expected = {
        (op, g, size) for g in (2, 4) for op in ALL_OPS for size in (1024, 4096, 16384) if op != "send_recv" or g == 2
    }
    assert {(r.op, r.world_size, r.bytes) for r in rows} == expected
    four = {r.op: r.busbw_gbps / r.algbw_gbps for r in rows if r.world_size == 4 and r.bytes == 4096}
    assert four == pytest.approx({"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "all_to_all": 0.75})
    assert "wrote 27 collective rows" in done.stdout
