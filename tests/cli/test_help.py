"""``--help`` names what is registered (encodings, tasks, presets, extension methods), read from the registries
when the help is shown; training-free methods take no training steps without being told; ``extend``'s default
preset is the small one."""

from __future__ import annotations

import json
import re

import pytest

from posbench.cli import main
from posbench.tasks.presets import preset_of, presets_of


def _help(capsys, monkeypatch, *argv) -> str:
    monkeypatch.setenv("COLUMNS", "400")              # no wrapping inside a list of names
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def _names_in(text: str, names) -> list[str]:
    return [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]


def test_run_help_names_every_encoding_task_and_preset(capsys, monkeypatch):
    from posbench.encodings import ENCODINGS
    from posbench.tasks import TASKS

    text = _help(capsys, monkeypatch, "run")
    presets = {p for cls in TASKS.values() for p in presets_of(cls)}
    assert {"tiny", "small", "gpu", "paper"} <= presets
    assert _names_in(text, sorted(ENCODINGS)) == []
    assert _names_in(text, sorted(TASKS)) == []
    assert _names_in(text, sorted(presets)) == []


def test_extend_help_names_every_method_and_its_presets(capsys, monkeypatch):
    from posbench.hf.methods import METHODS
    from posbench.tasks import TASKS

    text = _help(capsys, monkeypatch, "extend")
    assert {"tape", "lora", "longlora", "theta", "yarn", "ntk"} <= set(METHODS)
    assert _names_in(text, list(METHODS)) == []
    assert _names_in(text, list(presets_of(TASKS["extend"]))) == []
    assert "small (default)" in text and "ntk: training-free" in text


def test_a_registered_plugin_method_appears_in_the_help(capsys, monkeypatch):
    from posbench.hf.methods import METHODS, NtkMethod

    class Plugin(NtkMethod):
        name = "my-plugin-method"
        description = "a test plugin"

    try:
        assert "my-plugin-method" in _help(capsys, monkeypatch, "extend")
    finally:
        METHODS.remove("my-plugin-method")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from posbench.hf.tiny import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny-llama", max_positions=64, layers=2)


def _dry_run(capsys, *argv) -> dict:
    assert main(["extend", *map(str, argv), "--dry-run"]) == 0, capsys.readouterr().err
    (config,) = json.loads(capsys.readouterr().out)
    return config


def test_extend_defaults_to_the_small_preset_and_ntk_to_no_training(llama_dir, capsys, tmp_path):
    from posbench.tasks import TASKS

    small = preset_of(TASKS["extend"], "small")["train"]
    common = ("--model", llama_dir, "--length", 128, "--data", "stdlib")
    tape = _dry_run(capsys, *common, "--method", "tape")
    assert tape["preset"] == "small" and tape["train"]["steps"] == small["steps"] == 50
    ntk = _dry_run(capsys, *common, "--method", "ntk")
    assert ntk["train"]["steps"] == 0
    assert _dry_run(capsys, *common, "--method", "ntk", "--preset", "paper")["train"]["steps"] == 0
    code = main(["extend", *map(str, common), "--method", "ntk", "--steps", "3", "-q", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "trains nothing" in err and "leave --steps out" in err


def test_the_synopses_name_every_option_of_every_command_and_no_other():
    """docs/running.md's synopsis block lists each command with exactly the long options the command takes
    (issue 36, item 6: extend's synopsis lacked --seed --device --out --quiet)."""
    import re
    from pathlib import Path

    import click
    import typer

    from posbench.cli.app import app

    text = (Path(__file__).resolve().parents[2] / "docs" / "running.md").read_text()
    block = text.split("```text", 1)[1].split("```", 1)[0]
    shown: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        start = re.match(r"posbench (\w+)", line)
        current = start.group(1) if start else current
        shown.setdefault(current, set()).update(re.findall(r"--[a-z][a-z-]*", line))
    group = typer.main.get_command(app)
    for name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), name)
        takes = {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} - {"--help"}
        assert shown.get(name) == takes, (name, sorted(takes ^ shown.get(name, set())))


@pytest.mark.slow  # posbench --help, a fresh process
def test_the_command_list_puts_each_summary_on_one_line_when_it_fits():
    """``posbench --help`` wraps a command's summary at the terminal's width, never where its docstring's lines end
    (issue 36, item 6)."""
    import os
    import subprocess
    import sys

    import importlib

    app_module = importlib.import_module("posbench.cli.app")
    proc = subprocess.run([sys.executable, "-m", "posbench", "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "400"})
    lines = proc.stdout.splitlines()
    for name in ("run", "ls", "extend", "compare", "sweep", "check"):
        summary = app_module.summary(getattr(getattr(app_module, name), name))
        assert any(summary in line for line in lines), name
    assert "another run's checkpoint" not in subprocess.run([sys.executable, "-m", "posbench", "run", "--help"],
                                                            capture_output=True, text=True).stdout


def test_the_methods_options_are_flags_of_extend(llama_dir, capsys):
    common = ("--model", llama_dir, "--length", 128, "--data", "stdlib")
    tape = _dry_run(capsys, *common, "--method", "tape", "--gate", "scalar", "--tape-position-size", 16)
    assert tape["encoding_options"]["gate"] == "scalar" and tape["encoding_options"]["position_size"] == 16
    lora = _dry_run(capsys, *common, "--method", "lora", "--r", 4)
    assert lora["encoding_options"]["r"] == 4
    assert main(["extend", *map(str, common), "--method", "lora", "--gate", "scalar", "--dry-run"]) == 2
    assert "No such option: --gate" in capsys.readouterr().err              # a TAPE option, not LoRA's


def test_the_sweep_help_names_the_study_files_slurm_table(capsys, monkeypatch):
    """Rich read "[slurm]" as markup and dropped it: the help said "the study file's  table"."""
    text = _help(capsys, monkeypatch, "sweep")
    assert "study file's [slurm] table" in text


@pytest.mark.parametrize("command", ["run", "extend", "bench", "sweep", "compare", "ls"])
def test_dash_h_is_help_for_every_command(capsys, monkeypatch, command):
    """``-h`` is ``--help`` everywhere: the commands whose flags are made per command line (run, extend, bench,
    sweep) take it too (their first parse once made click keep a --help-only option)."""
    monkeypatch.setenv("COLUMNS", "120")
    texts = []
    for flag in ("-h", "--help"):
        assert main([command, flag]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and f"posbench {command}" in texts[0]
