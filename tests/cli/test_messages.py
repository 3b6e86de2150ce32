"""Every option an error or a hint names exists on the command it names.

Two checks. Statically, over the source of the package: each `planner_command(...)` call (the
one way a message names a command to type next) gets its command and option names as
literals, and each must exist on that command; an error raised in a CLI module may name
bare options only of the commands that module defines; in the exporters and the search no
error names a bare option at all (they go through `planner_command`), and elsewhere a bare
option must exist on some command. Dynamically, the messages of real failing invocations:
every backquoted `planner COMMAND ... OPTIONS` in them, and every bare option, is checked the
same way against the command that failed. Options are read from the typer app itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer.main

import planner
from planner.cli import app

PACKAGE = Path(planner.__file__).parent
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
COMMAND = re.compile(r"`planner (\w+) ([^`]*)`")
OTHER_PROGRAMS = {"--nproc-per-node": "torchrun", "--rotary-base": "Megatron-LM"}
"""Options of another program that a message names along with it (Megatron-LM's own arguments; `planner profile
--collectives` tells how to launch itself under torchrun)."""


def _options() -> dict[str, set[str]]:
    group = typer.main.get_command(app)
    return {
        name: {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for name, command in group.commands.items()
    }


OPTIONS = _options()


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _literal_head(node: ast.expr) -> str | None:
    """A string literal, or the literal start of an f-string; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    return None


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent).as_posix(), ast.parse(path.read_text())


def _strings_outside_hints(node: ast.AST):
    """String constants under `node`, not descending into planner_command calls."""
    if isinstance(node, ast.Call) and _name(node.func) == "planner_command":
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    for child in ast.iter_child_nodes(node):
        yield from _strings_outside_hints(child)


def _commands_defined(tree: ast.Module) -> set[str]:
    """The names of the `@app.command("name")` functions of a module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and _name(decorator.func) == "command" and decorator.args:
                    names.add(decorator.args[0].value)
    return names


def test_every_suggested_command_names_options_it_has():
    calls = []
    for module, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "planner_command":
                calls.append((module, node))
    assert len(calls) >= 10  # the exporters, the search's hints and the CLI's all use it
    for module, call in calls:
        where = f"{module}:{call.lineno}"
        command = _literal_head(call.args[0])
        assert command in OPTIONS and command == call.args[0].value, f"{where}: command must be a literal"
        for argument in call.args[1:]:
            head = _literal_head(argument)
            assert head is not None and head.startswith("-"), f"{where}: option names must be literal"
            option = head.split()[0]
            assert option in OPTIONS[command], f"{where}: `planner {command}` has no {option}"


def test_errors_name_bare_options_only_of_their_own_command():
    checked = 0
    for module, tree in _sources():
        own = _commands_defined(tree)
        strict = module.startswith(("planner/export/", "planner/search/"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _name(node.func).endswith("Error")):
                continue
            for text in _strings_outside_hints(node):
                for option in OPTION.findall(text):
                    if not option.startswith("--") or (option in OTHER_PROGRAMS and OTHER_PROGRAMS[option] in text):
                        continue
                    checked += 1
                    where = f"{module}:{node.lineno}: {option}"
                    assert not strict, f"{where}: name it with planner_command(...)"
                    if own:
                        assert any(option in OPTIONS[c] for c in own), f"{where} is not an option of {own}"
                    else:
                        assert any(option in opts for opts in OPTIONS.values()), f"{where} is no option at all"
    assert checked >= 10


def _check_message(command: str, message: str) -> None:
    """Each backquoted planner command's options exist on it; each other option on `command`."""
    for named, rest in COMMAND.findall(message):
        assert named in OPTIONS, message
        for option in OPTION.findall(rest):
            assert option in OPTIONS[named], f"`planner {named}` has no {option}: {message}"
    for option in OPTION.findall(COMMAND.sub("", message)):
        if option.startswith("--"):
            assert option in OPTIONS[command], f"`planner {command}` has no {option}: {message}"


BASE = ["--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--seq", "4096"]


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", *BASE, "--tp", "0"],
        ["plan", *BASE, "--tp", "two"],
        ["plan", *BASE, "--cut-solver", "magic"],
        ["plan", "--model", "llama3-8b", "--gpus", "12", "--global-batch", "64", "--seq", "4096"],
        ["plan", "--model", "llama3-8b", "--gpus", "1000", "--global-batch", "64", "--seq", "4096"],
        [
            "plan",
            "--model",
            "llama3-70b",
            "--gpus",
            "8",
            "--global-batch",
            "64",
            "--seq",
            "4096",
            "--recompute",
            "none",
            "--mbs",
            "2,4",
        ],
        ["plan", *BASE, "--runtime", "deepspeed", "--tp", "2"],
        ["evaluate", *BASE, "--recompute", "none,full"],
        ["evaluate", *BASE, "--pp", "64"],
        ["sweep", "--model", "llama3-8b", "--seq", "4096", "--vary", "gpus", "--values", "8"],
        ["sweep", *BASE, "--vary", "heads", "--values", "8"],
        ["sweep", *BASE, "--vary", "gpus", "--values", "0"],
    ],
)
def test_cli_errors_name_options_that_exist(cli, argv):
    code, out, err = cli(*argv)
    assert code == 2 and err.startswith("error: "), err
    _check_message(argv[0], err)


def test_export_refusals_name_options_that_exist(tmp_path, capsys):
    """Every exporter refusal the exporters' own tests trigger, plus an index out of range."""
    from planner.catalog import resolve_model
    from planner.cli import run
    from planner.plan import PlanEntry, PlanFile

    def make_plan(model, **fields):
        entry = (
            dict(
                tp=1,
                pp=2,
                dp=1,
                mbs=1,
                num_microbatches=4,
                global_batch=4,
                seq=64,
                schedule="1f1b",
                stage_layers=[[0, 2], [2, 4]],
            )
            | fields
        )
        entry["global_batch"] = entry["dp"] * entry["mbs"] * entry["num_microbatches"]
        return PlanFile(plans=[PlanEntry(**entry)], model=resolve_model(model))

    cases = [
        ("megatron", dict(schedule="zbv", vpp=2, stage_layers=[[[0, 1], [3, 4]], [[1, 2], [2, 3]]])),
        ("megatron", dict(zero_stage=2)),
        ("deepspeed", dict(zero_stage=3)),
        ("deepspeed", dict(tp=2)),
        ("deepspeed", dict(recompute="selective")),
        ("torchtitan", dict(recompute=["full", "none"])),
        ("torch", dict(cp=2)),
    ]
    for number, (runtime, fields) in enumerate(cases):
        path = tmp_path / f"plan{number}.json"
        path.write_text(make_plan("tiny-llama", **fields).model_dump_json())
        for extra in ([], ["--number", "4"]):
            with pytest.raises(SystemExit) as exit_info:
                run(["export", str(path), "--to", runtime, "-o", str(tmp_path / "out"), *extra])
            _, err = capsys.readouterr()
            assert exit_info.value.code == 2 and err.startswith("error: "), err
            assert COMMAND.search(err), f"a refusal says what to type next: {err}"
            _check_message("export", err)
