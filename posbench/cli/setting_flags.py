"""Every declared setting is also a flag: ``--steps 5`` is ``--set task.steps=5`` when the task declares ``steps``,
else ``--set train.steps=5``, else ``--set model.steps=5`` (the task's own option first, then train's, then
model's), and the chosen encoding's options are flags too: ``--theta 500000`` (when no task, train or model setting
has the name) or ``--rope-theta 500000`` (always; with several encodings it sets that one's only, where ``--theta``
sets every chosen encoding that declares ``theta``). Nothing is declared here: the flags are made, when the command
line is read, from the one declaration of each option (``posbench.options``: a task's ``OPTIONS``, ``TrainConfig``'s
and ``ModelConfig``'s fields), so their names, types, defaults, ranges and help cannot drift from what ``--set``,
presets and ``posbench ls`` use. A flag becomes a typed ``Setting`` (section, key, value: read here, once, as its
declaration's type; never text again), applied before the command line's own ``--set`` entries, so the one
precedence is: declared default < preset < --init model < study < flags < ``--set`` (of a flag given twice, the
last).

A setting's flag is its key with dashes, or its declaration's ``flag`` (bench's timed steps: ``--timed-steps``, as
``--steps`` is ``train.steps`` in every command).

Spellings: ``--name value``, ``--name=value``, underscores or dashes (``--new-tokens``); a true / false option
also as ``--name`` alone (true) and ``--no-name`` (false). Lists are comma-separated (``--lengths 1024,8192``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from posbench.errors import ConfigError
from posbench.options import Switch

if TYPE_CHECKING:                       # (posbench.runs.config imports torch: read when flags are)
    from posbench.runs.config import Setting

#: the sections whose options are flags, in the order a name is looked up
SECTIONS = ("task", "train", "model")


#: the section of a flag that names its encoding (``--rope-theta``): "encoding:rope"
ONE_ENCODING = "encoding:"


def declarations(task_name: str, encodings: Iterable[str] = ()) -> dict[str, tuple[str, Any]]:
    """Flag name (dashes) -> (section, its ``Option``), for a run of task ``task_name`` with ``encodings`` (names
    of the task's registry: encodings, or extend's methods; an unknown name is refused by the registry, in one
    line). An encoding's option is always ``--NAME-KEY``; it is also ``--KEY`` unless that name is taken (a task,
    train or model setting, or another encoding's ``--NAME-KEY``: DAPE's ``fire_init_l`` is ``--dape-fire-init-l``
    when FIRE is chosen too) or the chosen encodings that declare it give it different types (DAPE's ``base`` is
    a name, Sandwich's a number)."""
    from posbench.options import declared

    owners = section_options(task_name)
    found: dict[str, tuple[str, Any]] = {}
    for section in SECTIONS:
        for key, option in owners[section].items():
            if not getattr(option, "from_task", False):
                found.setdefault(flag_name(key, option), (section, option))
    chosen = {name: {key: option for key, option in declared(cls).items()
                     if not getattr(option, "from_task", False)}          # what the task gives is no flag
              for name, cls in encoding_classes(task_name, encodings).items()}
    for name, options in chosen.items():
        for key, option in options.items():
            found[f"{name}-{key}".replace("_", "-")] = (ONE_ENCODING + name, option)
    for name, options in chosen.items():
        for key, option in options.items():
            flag = key.replace("_", "-")
            kinds = {type(o[key].default) for o in chosen.values() if key in o}
            if flag not in found and len(kinds) == 1:     # one meaning: no other setting's name, one type
                found[flag] = ("encoding", option)
    return found


def section_options(task_name: str) -> dict[str, dict[str, Any]]:
    """The declarations of the task's, train's and model's settings, by section."""
    from posbench.options import declared
    from posbench.runs.config import model_options, task_class
    from posbench.train.config import TrainConfig

    return {"task": declared(task_class(task_name)), "train": declared(TrainConfig), "model": model_options()}


def flag_name(key: str, option: Any) -> str:
    """A setting's flag, without its dashes: its ``Option.flag`` if it has one (bench's ``steps`` is
    ``timed-steps``), else its key with dashes (``new_tokens``: ``new-tokens``)."""
    return getattr(option, "flag", "") or key.replace("_", "-")


def renamed_keys(task_name: str) -> dict[str, str]:
    """``timed_steps`` -> ``steps``: the key each setting whose flag is not its key's name sets."""
    return {flag.replace("-", "_"): key for options in section_options(task_name).values()
            for key, option in options.items() if (flag := getattr(option, "flag", ""))}


def encoding_classes(task_name: str, names: Iterable[str]) -> dict[str, Any]:
    """The classes of ``names`` in the registry the task's runs choose from (its model source's)."""
    from posbench.runs.config import task_class

    task = task_class(task_name)
    registry = task.model_source.encodings() if task is not None and names else {}
    return {name: registry.get(name) for name in names if registry.get(name) is not None}


def for_encoding(settings: list[Setting], task_name: str, name: str | None) -> list[Setting]:
    """The ``settings_from_flags`` that apply to the run of encoding ``name``: an ``encoding`` setting when that
    encoding declares its key (``--theta`` with ``-e rope,alibi`` sets RoPE's theta, and ALiBi has none), an
    ``encoding:NAME`` one (``--rope-theta``) for that encoding only, every other as it is."""
    from posbench.options import declared

    cls = encoding_classes(task_name, [name] if name else []).get(name)
    own = set(declared(cls)) if cls is not None else set()
    kept = []
    for setting in settings:
        if setting.section == "encoding" and setting.key not in own:
            continue
        if setting.section.startswith(ONE_ENCODING):
            if setting.section != ONE_ENCODING + str(name):
                continue
            setting = setting._replace(section="encoding")
        kept.append(setting)
    return kept


def settings_from_flags(args: list[str], task_name: str, command: str, own: Iterable[str] = (),
                        encodings: Iterable[str] = ()) -> list[Setting]:
    """The typed ``Setting``s that the flags ``args`` name; one ``ConfigError`` line for an unknown flag (with the
    nearest names, the command's ``own`` options among them), a stray word or a value of the wrong type. With
    ``encodings``, their options are flags too: pass each run's settings through ``for_encoding``."""
    from posbench.runs.config import Setting, typed

    where = (f"the {task_name} task's settings, train's, model's and the encoding's are flags: 'posbench ls tasks "
             f"{task_name}' lists the task's, 'posbench ls encodings NAME' an encoding's")
    renamed = renamed_keys(task_name)
    known = declarations(task_name, encodings)
    found = []
    for section, flag_key, value in parse_flags(args, known, command, where, own):
        option = known[flag_key.replace("_", "-")][1]
        key = option_key(section, renamed.get(flag_key, flag_key) if section in SECTIONS else flag_key)
        at = "encoding" if section.startswith(ONE_ENCODING) else section
        found.append(Setting(section, key, typed(f"{at}.{key}", value, option.default, option.limit)))
    return found


def option_key(section: str, key: str) -> str:
    """The option a flag sets: ``rope_theta`` in section ``encoding:rope`` is ``theta``."""
    return key.removeprefix(section.removeprefix(ONE_ENCODING).replace("-", "_") + "_") \
        if section.startswith(ONE_ENCODING) else key


def own_options(command: Any) -> dict[str, str]:
    """The options a click command declares itself (``--dry-run``, ``-q``, ``--no-compiled``: never settings flags),
    each with its help (an unknown flag's suggestions read it)."""
    return {name: getattr(param, "help", None) or "" for param in command.params
            for name in (*getattr(param, "opts", []), *getattr(param, "secondary_opts", []))}


def parse_flags(args: list[str], known: dict[str, tuple[str, Any]], command: str, where: str,
                own: Iterable[str] = ()) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` for each flag of ``args``, ``known`` mapping flag names (dashes) to their section
    and declaration; ``where`` says, in an unknown flag's error, where the valid ones are listed."""
    found, i = [], 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--") or word == "--":
            raise ConfigError(f"{command}: unexpected argument {word!r} (settings are flags: --name value)")
        name, eq, value = word[2:].partition("=")
        name = name.replace("_", "-")
        negated = name.startswith("no-") and name not in known and name[3:] in known \
            and true_or_false(known[name[3:]][1])
        key = name[3:] if negated else name
        if key not in known:
            names = [*known, *(o[2:] for o in own if o.startswith("--"))]
            close = suggestions(key, names, own)
            hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
            raise ConfigError(f"{command}: unknown option --{name}{hint} ({where})")
        if negated and eq:
            raise ConfigError(f"{command}: --{name} takes no value (--{key} VALUE sets one)")
        section, option = known[key]
        boolean = true_or_false(option)                                        # a Switch: or auto
        needs_value = ConfigError(f"{command}: --{name} needs a value ({section}.{key.replace('-', '_')}: "
                                  f"{option.help})")
        if negated or (boolean and not eq and (i + 1 == len(args) or args[i + 1].startswith("--"))):
            if not boolean:
                raise needs_value
            value, i = ("false" if negated else "true"), i + 1
        elif not eq:
            if i + 1 == len(args) or args[i + 1].startswith("--"):
                raise needs_value
            value, i = args[i + 1], i + 2
        else:
            i += 1
        found.append((section, key.replace("-", "_"), value))
    return found


def suggestions(key: str, names: list[str], own: Iterable[str] | dict[str, str]) -> list[str]:
    """What an unknown flag ``--key`` may have meant, best first, at most 3: the options whose name begins it
    (``--output``: ``--out``), else the command's own options whose help names it (``described``), else the
    nearest spellings."""
    begins = [name for name in names if len(name) >= 3 and key.startswith(name) and key != name]
    return (begins or described(key, own) or difflib.get_close_matches(key, names, n=3))[:3]


def described(key: str, own: Iterable[str] | dict[str, str]) -> list[str]:
    """The command's own options whose help has a word that starts with ``key`` (at least 4 letters): ``--results``
    is ``--out`` ("Results root directory"), where its spelling is nearest ``--resume``."""
    if len(key) < 4 or not isinstance(own, dict):
        return []
    word = re.compile(rf"\b{re.escape(key.replace('-', ' '))}", re.IGNORECASE)
    return [name[2:] for name, text in own.items() if name.startswith("--") and word.search(text)][:3]


def true_or_false(option: Any) -> bool:
    """Whether the setting may be given as ``--name`` alone (true) or ``--no-name`` (false)."""
    return isinstance(option.default, bool) or isinstance(option.limit, Switch)


def flags_help(task_name: str, taken: set[str] = frozenset(), known: dict[str, tuple[str, Any]] | None = None) -> str:
    """The flags of a run of ``task_name`` (or ``known``), one line each, for ``--help`` (read when the help is
    shown); ``taken``: names the command declares itself (its own ``--encoding``), left out."""
    lines = []
    renamed = renamed_keys(task_name) if known is None else {}
    for name, (section, option) in (known if known is not None else declarations(task_name)).items():
        if f"--{name}" in taken:
            continue
        default = ",".join(map(str, option.default)) if isinstance(option.default, list) else option.default
        default = "none" if default in ("", None) else default
        key = name.replace("-", "_")
        lines.append(f"  --{name}  {option.help} ({section}.{renamed.get(key, key)}, default {default})")
    return "\n\n".join(lines)


def slurm_declarations() -> dict[str, tuple[str, Any]]:
    """The sweep's executor settings (``posbench.sweep.slurm.SlurmOptions``) as flags: ``--partition gpu``."""
    from posbench.options import declared
    from posbench.sweep.slurm import SlurmOptions

    return {key.replace("_", "-"): ("slurm", option) for key, option in declared(SlurmOptions).items()
            if key != "additional"}                  # a table: the study file's [slurm] only
