"""Every setting is declared once (issue 37, item 1): the flags of ``run`` and ``bench`` are made from the options'
declarations (``posbench.cli.setting_flags``), never written again in ``posbench/cli``; they are real options of the
CLI library, which reads them (issue 50, item 3)."""

from __future__ import annotations

import click
import pytest
import typer

from posbench.cli.app import app
from posbench.cli.setting_flags import click_params, declarations, given
from posbench.errors import ConfigError
from posbench.options import declared
from posbench.tasks import TASKS
from posbench.train.config import TrainConfig

#: the command-line options that share a name with a declared setting, each a different thing or the same
#: declaration: nothing else in posbench/cli may (a test below lists them all)
SHARED_NAMES = {
    ("score", "--data"): "the directory of a data set to score against, not a run's data source",
}


def commands() -> dict:
    """Every command of ``posbench``, built (the group builds a command when it is called for)."""
    group = typer.main.get_command(app)
    ctx = click.Context(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def command_line(command: str, *args: str):
    """The context of ``posbench COMMAND ARGS`` once click has read it (nothing run)."""
    return commands()[command].make_context(command, list(args))


def flags_of(command: str, *args: str) -> list:
    return given(command_line(command, *args))


def one_error(capsys, *argv: str) -> str:
    from posbench.cli.app import main

    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


def test_no_command_declares_a_setting_again():
    every = {f"--{name}" for task in TASKS for name in declarations(task)}
    shared = set()
    for name, command in commands().items():
        for param in command.params:
            shared |= {(name, opt) for opt in param.opts if opt in every}
    assert shared == set(SHARED_NAMES)


def test_bench_flags_are_the_tasks_train_and_model_declarations():
    from posbench.bench import Bench

    known = declarations("bench")
    bench = Bench
    for key, option in declared(bench).items():
        assert known[option.flag or key.replace("_", "-")] == ("task", key, option)   # the one declaration
    assert known["timed-steps"][0] == "task" and known["steps"][0] == "train"     # --steps: train.steps everywhere
    assert known["threads"] == ("train", "threads", declared(TrainConfig)["threads"])
    assert known["timed-steps"][1] == "steps"                            # the key its flag's name is not
    helps = {param.opts[0]: param.help for param in click_params(known)}
    for key, option in declared(bench).items():
        assert helps[f"--{option.flag or key.replace('_', '-')}"].startswith(f"{option.help} (task.{key}, default ")


@pytest.mark.parametrize("args, settings", [
    (["--timed-steps", "5"], [("task", "steps", 5)]),                        # bench's timed steps: its own flag name
    (["--timed_steps=5", "--new_tokens", "7", "--new-tokens=8"], [("task", "steps", 5), ("task", "new_tokens", 8)]),
    (["--steps", "5"], [("train", "steps", 5)]),                             # --steps: train.steps (bench refuses it)
    (["--threads", "2", "--attention", "flex"], [("train", "threads", 2), ("model", "attention", "flex")]),
    (["--compile"], [("train", "compile", True)]),                           # a true / false / auto switch, alone
    (["--no-compile", "--checkpointing"], [("train", "compile", False), ("train", "checkpointing", True)]),
    (["--compile", "--no-compile", "--lengths", "16,32"], [("train", "compile", False), ("task", "lengths", [16, 32])]),
    (["--init-std", "-0.5"], [("model", "init_std", -0.5)]),                 # a negative value is a value
    (["--lr", "1", "--lr=-1e-3"], [("train", "lr", -1e-3)]),                # given twice: the last
])
def test_flags_become_typed_settings(args, settings):
    """A flag is read once, by click, into (section, key, typed value): never text again."""
    found = flags_of("bench", *args)
    assert found == settings and [type(s.value) for s in found] == [type(v) for _, _, v in settings]


def test_a_task_without_steps_sends_steps_to_train():
    assert flags_of("run", "-t", "arithmetic", "--steps", "9", "--train-digits", "4") == \
        [("train", "steps", 9), ("task", "train_digits", 4)]


def test_the_flags_are_click_options_of_this_command_line_only():
    """The flags are parameters of the command for the command line read (``get_params``), made from the
    declarations of the task and encodings it names; the command itself (shared by every command line) keeps its
    own options only."""
    from typer.core import TyperOption

    ctx = command_line("run", "-t", "arithmetic", "-e", "rope", "--lr", "-1e-3", "--no-checkpointing")
    options = {name: param for param in ctx.command.get_params(ctx) for name in param.opts}
    for flag in ("--steps", "--train-digits", "--rope-theta", "--theta", "--checkpointing"):
        assert isinstance(options[flag], TyperOption) and not options[flag].expose_value, flag
    assert options["--checkpointing"].secondary_opts == ["--no-checkpointing"]          # click's own --no- form
    assert given(ctx) == [("train", "lr", -1e-3), ("train", "checkpointing", False)]
    own = {name for param in ctx.command.params for name in param.opts}
    assert "--steps" not in own and "--train-digits" not in own and "-t" in own
    other = command_line("run", "-t", "perplexity")                     # another task: its flags, not arithmetic's
    names = {name for param in other.command.get_params(other) for name in param.opts}
    assert "--train-digits" not in names and "--steps" in names and "--rope-theta" not in names
    assert flags_of("extend", "--method", "tape", "-l", "128") == [("task", "length", 128)]     # -l: --length


def test_the_help_lists_the_flags_of_the_chosen_task_and_encodings(capsys, monkeypatch):
    from posbench.cli.app import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["run", "-t", "arithmetic", "-e", "rope", "--help"]) == 0
    text = capsys.readouterr().out
    assert "Settings" in text and "--no-checkpointing" in text
    assert "(task.train_digits, default" in text and "(encoding.theta, default" in text
    assert main(["run", "--help"]) == 0                           # no task chosen: train's and model's flags
    text = capsys.readouterr().out
    assert "(train.lr, default" in text and "(task." not in text and "(encoding." not in text
    assert main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--timed-steps" in text and "--steps " not in text               # bench refuses train.steps: not shown


def test_a_flag_of_the_wrong_type_is_one_line(capsys):
    err = one_error(capsys, "run", "-t", "arithmetic", "--steps", "five")
    assert err.endswith("Invalid value for '--steps': train.steps='five': expected an integer (see 'posbench run "
                        "--help')")


@pytest.mark.parametrize("args, message", [
    (["--timed-stepz", "3"], "No such option: --timed-stepz (Possible options: "),
    (["--warmup"], "Option '--warmup' requires an argument."),
    (["--warmup", "--timed-steps", "2"], "Invalid value for '--warmup': needs a value (--timed-steps is an option)"),
    (["--no-timed-steps"], "No such option: --no-timed-steps"),       # steps is no true / false setting
    (["--compile", "false"], "Got unexpected extra argument(s) (false)"),    # true / false: --compile, --no-compile
    (["3"], "Got unexpected extra argument(s) (3)"),
])
def test_bad_flags_are_one_line(args, message, capsys):
    err = one_error(capsys, "bench", "--dry-run", *args)
    assert message in err and "(see 'posbench bench --help')" in err, err
    if "stepz" in message:
        assert "--timed-steps" in err


def test_a_flag_and_set_keep_the_one_precedence(capsys):
    """Flags are typed settings applied first: a --set after them wins; presets lose to both."""
    import json

    from posbench.cli.app import main

    code = main(["bench", "--size", "paper", "--timed-steps", "4", "--set", "task.steps=6", "--warmup", "1",
                 "--dry-run"])
    config = json.loads(capsys.readouterr().out)[0]
    assert code == 0 and config["task_options"]["steps"] == 6 and config["task_options"]["warmup"] == 1
    assert config["task_options"]["lengths"] == [1024, 8192]                 # the preset's, untouched


# ---- the encoding's options are flags too ------------------------------------------------------------------

def test_every_option_of_every_encoding_is_a_flag_of_its_run():
    from posbench.encodings import ENCODINGS

    for name in ENCODINGS:
        cls = ENCODINGS.get(name)
        known = declarations("perplexity", [name])
        for key, option in declared(cls).items():
            if option.from_task:                      # Abacus's digit ids, RandPE's evaluation length: the task's
                assert f"{name}-{key}".replace("_", "-") not in known
                continue
            assert known[f"{name}-{key}".replace("_", "-")] == (f"encoding:{name}", key, option)   # the one
            section, _, owner = known[key.replace("_", "-")]
            assert (section == "encoding") == (owner is option)      # the plain name: this option, or another's


def run_dry(capsys, *argv) -> list[dict]:
    import json

    from posbench.cli.app import main

    code = main(["run", "-t", "arithmetic", "-p", "tiny", "--dry-run", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_encoding_flags_set_the_encodings_that_declare_them(capsys):
    rope, alibi = run_dry(capsys, "-e", "rope,alibi", "--theta", "500")
    assert rope["encoding_options"]["theta"] == 500 and "theta" not in alibi["encoding_options"]
    rope, xpos = run_dry(capsys, "-e", "rope,xpos", "--rope-theta", "500")     # this encoding's only
    assert rope["encoding_options"]["theta"] == 500 and xpos["encoding_options"]["theta"] == 10000
    rope, xpos = run_dry(capsys, "-e", "rope,xpos", "--theta", "700", "--xpos-theta", "9")
    assert (rope["encoding_options"]["theta"], xpos["encoding_options"]["theta"]) == (700, 9)
    (fire,) = run_dry(capsys, "-e", "fire", "--eps", "1e-5", "--fire-eps", "0.5")  # train's eps, and FIRE's
    assert fire["train"]["eps"] == 1e-5 and fire["encoding_options"]["eps"] == 0.5
    (rope,) = run_dry(capsys, "-e", "rope", "--theta", "77", "--set", "encoding.theta=88")
    assert rope["encoding_options"]["theta"] == 88                           # --set wins, as for every flag


def test_a_name_two_chosen_encodings_read_differently_is_no_plain_flag(capsys):
    # DAPE's fire_init_l is --fire-init-l alone; once FIRE (whose init_l is --fire-init-l) is chosen too the flag
    # means two settings and is refused (issue 59, item 3), never moved: DAPE's is --dape-fire-init-l, FIRE's --init-l
    (dape,) = run_dry(capsys, "-e", "dape", "--fire-init-l", "32")
    assert dape["encoding_options"]["fire_init_l"] == 32
    dape, fire = run_dry(capsys, "-e", "dape,fire", "--init-l", "32", "--dape-fire-init-l", "16")
    assert (dape["encoding_options"]["fire_init_l"], fire["encoding_options"]["init_l"]) == (16, 32)
    known = declarations("arithmetic", ["dape", "sandwich"])              # base: a name in DAPE, a number in Sandwich
    assert known["base"][0] == "ambiguous" and known["dape-base"][0] == "encoding:dape"


@pytest.mark.parametrize("argv, expected", [
    (["-e", "rope", "--thet", "5"], "No such option: --thet (Possible options: "),
    (["-e", "alibi", "--theta", "5"], "No such option: --theta"),            # ALiBi has no theta
    (["-e", "rope", "--alibi-theta", "5"], "No such option: --alibi-theta"),
    (["-e", "abacus", "--digit-ids", "1"], "No such option: --digit-ids"),   # the task gives it
    (["-e", "rope", "--theta", "-5"], "option theta=-5.0 is out of range"),  # the declaration's range
])
def test_bad_encoding_flags_are_one_line(argv, expected, capsys):
    from posbench.cli.app import main

    code = main(["run", "-t", "arithmetic", "-p", "tiny", "--dry-run", *argv])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    assert "--thet" not in argv or "--theta" in err                          # click's nearest names


def test_the_tape_method_takes_the_encodings_declarations():
    from posbench.encodings.tape import TAPE
    from posbench.hf.methods import METHODS

    for key, option in METHODS["tape"].OPTIONS.items():
        assert option is TAPE.OPTIONS[key]


# ---- a small Task: the model comes from a source of its own (issue 37, item 2) -------------------------------

def test_a_task_says_nothing_of_how_its_model_is_chosen_or_built():
    from posbench.tasks.base import Task

    for member in ("build_model", "choose_encoding", "take_init", "encodings", "needs_model"):
        assert not hasattr(Task, member), member
    from posbench.tasks.model_source import FRESH, OWN

    from posbench.bench import Bench

    assert TASKS["perplexity"].model_source is FRESH and Bench.model_source is OWN and "bench" not in TASKS
    assert type(TASKS["extend"].model_source).__name__ == "ExtendedLlama"


def test_a_task_written_for_the_old_hooks_is_refused_not_ignored():
    from posbench.tasks import Task

    with pytest.raises(TypeError, match="task 'test-old-hooks' defines needs_model, build_model: where the model "
                                        "comes from is now the task's model_source"):
        class OldTask(Task):
            name = "test-old-hooks"
            needs_model = False

            def build_model(self, device):
                return None, None
    assert "test-old-hooks" not in TASKS
    with pytest.raises(TypeError, match="task 'test-old-presets' defines preset_table: a task gives its presets"):
        class OldPresets(Task):
            name = "test-old-presets"

            @classmethod
            def preset_table(cls):
                return {}
    assert "test-old-presets" not in TASKS


def test_presets_are_read_outside_the_task():
    from posbench.tasks import Task
    from posbench.tasks.presets import preset_of, preset_path, presets_of

    for member in ("preset", "preset_table", "preset_file"):
        assert not hasattr(Task, member), member
    arithmetic = TASKS["arithmetic"]
    assert preset_path(arithmetic).name == "presets.toml" and preset_path(arithmetic).parent.name == "arithmetic"
    assert preset_of(arithmetic, "small") is presets_of(arithmetic)["small"]
    with pytest.raises(ConfigError, match="task 'arithmetic' has no preset 'huge'; presets: tiny, small, gpu, paper"):
        preset_of(arithmetic, "huge")


def test_a_task_with_its_own_model_source_is_run_by_the_one_runner(tmp_path):
    """A plugin task that names a source of its own: the configuration asks it for the encoding and the runner
    for the model (here a fresh model whose every weight is zeroed, so the run's loss is exactly ln(vocab))."""
    import math

    import torch

    from posbench.data.batch import Batch, masked_cross_entropy
    from posbench.evaluation.outcome import Evaluation, Metric
    from posbench.model import Transformer
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.tasks import Task
    from posbench.tasks.model_source import ModelSource

    asked = []

    class ZeroedModels(ModelSource):
        def choose_encoding(self, encoding, source):
            asked.append(encoding)
            return "nope"                                     # whatever --encoding said

        def build(self, task, device):
            model = Transformer(task.model_config())
            with torch.no_grad():
                for weight in model.parameters():
                    weight.zero_()
            return model, {"kind": "zeroed"}

    class Uniform(Task):
        name = "test-zeroed-source"
        description = "a task whose model comes from a source of its own"
        OPTIONS = {}
        presets = {"tiny": {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 8},
                            "train": {"steps": 0}}}
        default_preset = "tiny"
        model_source = ZeroedModels()

        def vocab_size(self):
            return 13

        def evaluate(self, model, device, reporter, phases):
            tokens = torch.arange(16).reshape(2, 8) % 13
            loss, count = masked_cross_entropy(model, Batch(tokens[:, :-1], tokens[:, 1:]))
            return Evaluation(metrics={"loss": Metric(loss.item() / count, None, count)}, primary="loss")

    try:
        config = resolve_run_config("test-zeroed-source", "rope", None, device="cpu")
        outcome = runner.execute(config, tmp_path)
    finally:
        TASKS.remove("test-zeroed-source")
    assert asked == ["rope"] and config.encoding == "nope"
    assert abs(outcome.record.metrics["loss"].value - math.log(13)) < 1e-6          # float32 logits of 0
    assert outcome.record.init == {"kind": "zeroed"}


# ---- the sweep's SLURM settings: one declaration for the study file, the flags and the help -----------------

def test_slurm_settings_from_the_study_file_and_the_flags_are_one_declaration(tmp_path):
    from posbench.cli.setting_flags import slurm_declarations
    from posbench.sweep.slurm import SlurmOptions, slurm_options
    from posbench.sweep.study import read_study

    study = tmp_path / "s.toml"
    study.write_text('encodings = ["rope"]\ntasks = ["arithmetic"]\n[slurm]\nqos = "high"\nmem = "8G"\ntime = 90\n')
    table = read_study(study).slurm                                     # every declared key is a valid key
    flags = {k: v for _, k, v in flags_of("sweep", "--qos", "low", str(study), "--gpus-per-cell", "2", "--time",
                                          "1:30:00")}
    options = slurm_options(table, flags)                                # the flags win over the table
    assert (options.qos, options.mem, options.time, options.gpus_per_cell) == ("low", "8G", 90, 2)
    assert set(slurm_declarations()) == {k.replace("_", "-") for k in declared(SlurmOptions)} - {"additional"}
    study.write_text('encodings = ["rope"]\ntasks = ["arithmetic"]\n[slurm]\nqoss = "high"\n')
    with pytest.raises(ConfigError, match="unknown key 'qoss'"):
        read_study(study)


def test_the_sweep_refuses_slurm_flags_for_a_local_run_and_misspellings(tmp_path, capsys):
    from posbench.cli.app import main

    study = tmp_path / "s.toml"
    study.write_text('encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = ["tiny"]\n')
    assert main(["sweep", str(study), "--dry-run", "--mem", "8G"]) == 2
    assert "--mem: options of --executor slurm" in capsys.readouterr().err
    assert main(["sweep", str(study), "--dry-run", "--executor", "slurm", "--partitoin", "gpu"]) == 2
    assert "No such option: --partitoin (Possible options: --partition)" in capsys.readouterr().err
    assert main(["sweep", str(study), "--dry-run", "--executor", "slurm", "--mem", "8G", "--time", "30"]) == 0
    assert "30 min per cell" in capsys.readouterr().out


# ---- the command line around the flags (review of issue 37's first version) ---------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["run", "-t", "arithmetic", "-e", "rope", "-p", "tiny", "--lr", "-1e-3"], "train.lr=-0.001 is out of range"),
    (["run", "-t", "arithmetic", "-e", "rope", "--dry-rn"], "No such option: --dry-rn (Possible options: --dry-run)"),
    (["run", "-t", "arithmetic", "-e", "rope", "--no-checkpointing=true"],
     "Option '--no-checkpointing' does not take a value."),
    (["run", "-t", "arithmetic", "-e", "rope", "--vocab-size", "300"], "No such option: --vocab-size"),
    (["run", "-t", "-e", "rope"], "unknown task '-e'"),                    # -t takes -e as its value, as click does
    (["bench", "--set", "batch=1,2,3", "--lengths", "1,2"], "bench: 3 batch sizes for 2 lengths"),
    (["extend", "--model", "x", "--method", "tape", "--set", "length=128"], "extend needs --data"),
])
def test_flags_at_the_command_line_are_one_line_errors(argv, expected, capsys):
    from posbench.cli.app import main

    assert main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_a_negative_value_and_a_set_after_the_flags(capsys):
    """``-1e-3`` is a value, not short options (``-e``); ``--set`` wins over a flag, whichever comes first."""
    import json

    from posbench.cli.app import main

    assert main(["run", "-t", "arithmetic", "-e", "rope", "-p", "tiny", "--set", "train.steps=5", "--steps", "10",
                 "--warmup-steps", "-0", "--dry-run"]) == 0
    config = json.loads(capsys.readouterr().out)[0]
    assert config["train"]["steps"] == 5 and config["train"]["warmup_steps"] == 0


def test_the_sweep_takes_its_flags_before_or_after_the_study_file(tmp_path, capsys):
    from posbench.cli.app import main

    study = tmp_path / "s.toml"
    study.write_text('encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = ["tiny"]\n')
    for argv in (["--executor", "slurm", "--partition", "gpu", str(study)], [str(study), "--partition=gpu",
                                                                           "--executor", "slurm"]):
        assert main(["sweep", *argv, "--dry-run"]) == 0
        assert "slurm: partition gpu" in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    ["-qt", "arithmetic", "-e", "rope"],                        # -q -t arithmetic, read by click
    ["-tarithmetic", "--encoding=rope"],
    ["--lr", "-1e-3", "-t", "arithmetic", "-e", "rope"],           # a negative value is no short option
    ["--task", "perplexity", "-e", "alibi", "--task", "arithmetic", "-e", "rope"],   # the last, as click keeps
])
def test_what_decides_the_flags_is_read_by_click(args):
    """The task and encodings that decide the flags are read by click's own parser, in a first, resilient parse,
    however the words spell them."""
    ctx = command_line("run", *args, "--train-digits", "3", "--theta", "7")
    assert [s for s in given(ctx) if s.section != "train"] == [("task", "train_digits", 3), ("encoding", "theta", 7.0)]
