"""From the recommended plan to a running job without a dead end: the three
situations a new user met, each answered with what to type next."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from planner.cli.report import RUNTIME_SHORT_NAMES
from planner.plan import parse_plan_file

README_REQUEST = ["--model", "llama3-70b", "--gpus", "1024", "--gpu", "h100", "--global-batch", "1024", "--seq", "8192"]
COMMAND = re.compile(r"`planner (\w+) ([^`]*)`")


def _tables(out: str) -> list[list[dict[str, str]]]:
    """The borderless plan tables (header `#  tp ...` or `#  cuts ...`, a rule, a row per plan):
    each row by column, cells split on runs of two or more spaces."""
    tables, lines = [], out.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("#  ") and lines[i + 1].startswith("─"):
            columns = re.split(r" {2,}", line.strip())
            rows = []
            for row in lines[i + 2 :]:
                if not row[:1].isdigit():
                    break
                rows.append(dict(zip(columns, re.split(r" {2,}", row.strip()))))
            tables.append(rows)
    return tables


def _runs_on(out: str) -> list[str]:
    """Each plan's `runs on`: in a table, or under it (one line when every plan has the same)."""
    tables = _tables(out)
    for table in tables:
        if "runs on" in table[0]:
            return [row["runs on"] for row in table]
    return [re.search(r"^runs on(?: \(every plan\))?: ([^;\s]+)", out, re.MULTILINE).group(1)] * len(tables[0])


def test_readme_request_says_where_each_plan_runs_and_export_follows_it(cli, tmp_path):
    path = tmp_path / "p.json"
    code, out, err = cli("plan", *README_REQUEST, "-o", str(path))
    assert code == 0, err
    document = parse_plan_file(path.read_text())
    assert len(_tables(out)[0]) == len(document.plans) == 5
    runs_on = [",".join(RUNTIME_SHORT_NAMES[name] for name in entry.runtimes) for entry in document.plans]
    assert _runs_on(out) == runs_on
    # the recommended plan does not run on some runtime: the table says so, and says how to get one
    best = document.plans[0]
    missing = next(name for name in RUNTIME_SHORT_NAMES if name not in best.runtimes)
    assert f"`planner plan {' '.join(README_REQUEST)} --runtime {missing}`" in out
    # exporting it there anyway is refused with the same two ways forward
    code, _, err = cli("export", str(path), "--to", missing, "-o", str(tmp_path / "refused"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    commands = COMMAND.findall(err)  # whole commands: the plan file's request, the export's own arguments
    assert ("plan", f"{' '.join(README_REQUEST)} --runtime {missing}") in commands
    assert ("export", f"{path} --out {tmp_path / 'refused'} --to {best.runtimes[0]}") in commands
    code, _, err = cli("export", str(path), "--to", best.runtimes[0], "-o", str(tmp_path / "ok"))
    assert code == 0, err
    # and following the advice gives a plan that runtime runs
    runtime_path = tmp_path / "runtime.json"
    code, out, err = cli("plan", *README_REQUEST, "--runtime", missing, "--top", "1", "-o", str(runtime_path), "--json")
    assert code == 0, err
    assert missing in json.loads(out)["plans"][0]["runtimes"]
    code, _, err = cli("export", str(runtime_path), "--to", missing, "-o", str(tmp_path / "followed"))
    assert code == 0, err


def test_evaluate_and_sweep_show_where_plans_run(cli):
    base = ["--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--seq", "4096"]
    code, out, err = cli("evaluate", *base, "--pp", "2", "--schedule", "zb_h1", "--json")
    assert code == 0, err
    assert json.loads(out)["plans"][0]["runtimes"] == ["torchtitan", "torch"]
    code, out, err = cli("evaluate", *base, "--pp", "2", "--schedule", "1f1b")
    assert code == 0, err
    assert _runs_on(out) == ["mt,tt,torch,ds"]
    code, out, err = cli("sweep", *base[:2], *base[4:], "--vary", "gpus", "--values", "8,16", "--json")
    assert code == 0, err
    assert all(point["plan"]["runtimes"] for point in json.loads(out)["points"])


def _has_mesh(spec, gpus: int, batch: int) -> bool:
    """The divisibility rules by brute force: tp within a node dividing heads, KV heads and FFN,
    pp at most the layers, dp x mbs (mbs 1, 2, 4, 8) dividing the batch; cp 1 (short sequence)."""
    for tp in range(1, min(8, gpus) + 1):
        if gpus % tp or spec.num_attention_heads % tp or spec.ffn_hidden_size % tp:
            continue
        if spec.num_kv_heads % tp and tp % spec.num_kv_heads:
            continue
        for pp in range(1, spec.num_layers + 1):
            if (gpus // tp) % pp == 0 and any(batch % (gpus // (tp * pp) * mbs) == 0 for mbs in (1, 2, 4, 8)):
                return True
    return False


def test_no_layout_names_the_nearest_gpu_counts_and_batches(cli):
    """A user's request: 1000 GPUs do not split global batch 1536 for GPT-3 175B."""
    from planner.catalog import resolve_model

    spec = resolve_model("gpt3-175b")
    request = ["--model", "gpt3-175b", "--gpus", "1000", "--global-batch", "1536", "--seq", "2048"]
    code, out, err = cli("plan", *request)
    assert code == 2 and out == ""
    assert err.startswith("error: no layout of gpt3-175b on 1000 GPUs") and err.count("error:") == 1
    below = next(n for n in range(992, 0, -8) if _has_mesh(spec, n, 1536))  # whole nodes of 8
    above = next(n for n in range(1008, 2001, 8) if _has_mesh(spec, n, 1536))
    smaller = next(b for b in range(1535, 0, -1) if _has_mesh(spec, 1000, b))
    larger = next(b for b in range(1537, 4000) if _has_mesh(spec, 1000, b))
    commands = COMMAND.findall(err)
    typed = dict(zip(request[::2], request[1::2]))  # each hint is the user's command with one value changed

    def changed(flag, value):
        return ("plan", " ".join(f"{f} {v}" for f, v in typed.items() if f != flag) + f" {flag} {value}")

    assert changed("--gpus", below) in commands and changed("--gpus", above) in commands
    assert changed("--global-batch", smaller) in commands and changed("--global-batch", larger) in commands
    # the tokens/s it names for the GPU count below is what `plan` finds there
    tokens = re.search(rf"--gpus {below}` \(best ([\d,]+) tokens/s", err).group(1)
    code, out, err = cli("plan", *request[:2], "--gpus", str(below), *request[4:], "--top", "1", "--json")
    assert code == 0, err
    assert f"{json.loads(out)['plans'][0]['predicted']['tokens_per_s']:,.0f}" == tokens


def test_no_layout_within_restrictions_says_so(cli):
    code, out, err = cli(
        "plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--seq", "4096", "--tp", "3"
    )
    assert code == 2 and err.startswith("error: ") and "within the restrictions given" in err
    assert "loosen the restrictions" in err


def test_a_runtime_that_cannot_run_the_model_is_refused_up_front(cli):
    code, _, err = cli(
        "plan",
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "32",
        "--global-batch",
        "32",
        "--seq",
        "4096",
        "--runtime",
        "deepspeed",
    )
    assert code == 2 and err.startswith("error: deepspeed runs no layout of mixtral-8x7b")
    assert "mixture of experts" in err and len(err.strip().splitlines()) == 1


def test_a_runtime_that_refuses_every_layout_that_fits_says_why(cli):
    """Megatron-LM shards ZeRO-2 with Megatron-FSDP, which it does not run with PP: with both
    pinned, every layout is refused, and the error says so rather than blaming memory."""
    code, _, err = cli(
        "plan",
        "--model",
        "tiny-llama",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq",
        "256",
        "--runtime",
        "megatron",
        "--zero",
        "2",
        "--pp",
        "2",
    )
    assert code == 2 and err.startswith("error: megatron runs none of the ")
    assert "ZeRO-2" in err and "--runtime megatron" not in err  # no advice to do what was done


def test_sweep_says_which_points_have_no_layout(cli):
    code, out, err = cli(
        "sweep",
        "--model",
        "llama3-8b",
        "--global-batch",
        "64",
        "--seq",
        "4096",
        "--vary",
        "gpus",
        "--values",
        "1000,1024",
        "--json",
    )
    assert code == 0, err
    none, some = json.loads(out)["points"]
    assert none["plan"] is None and none["note"].startswith("no layout")
    assert some["plan"]["predicted"]["tokens_per_s"] > 0
    assert set(some["plan"]["runtimes"]) <= set(RUNTIME_SHORT_NAMES)


@pytest.mark.parametrize("vary, values", [("gpus", "8,16"), ("global-batch", "32,64"), ("seq", "2048,4096")])
def test_sweep_names_the_varied_input_in_the_plan_command_it_suggests(cli, tmp_path, vary, values):
    """The sweep's `runs on` legend points to `planner plan ... -o plan.json` for one row: the
    varied input is a flag with its value to fill in, and with it the command runs."""
    fixed = {"gpus": "16", "global-batch": "64", "seq": "4096"}
    base = [
        "--model",
        "llama3-8b",
        *(word for name, value in fixed.items() if name != vary for word in (f"--{name}", value)),
    ]
    code, out, err = cli("sweep", *base, "--vary", vary, "--values", values)
    assert code == 0, err
    text = " ".join(out.split())
    command = re.search(r"`(planner plan [^`]*-o plan\.json)`", text).group(1)
    words = shlex.split(command)
    assert words[words.index(f"--{vary}") + 1] == "N" and "--vary" not in words and "--values" not in words
    value = values.split(",")[0]
    filled = [value if word == "N" else word for word in words[1:]]
    filled[filled.index("plan.json")] = str(tmp_path / "plan.json")
    code, _, err = cli(*filled)
    assert code == 0, err
