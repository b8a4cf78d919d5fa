"""What the declarations say about comparing runs (``posbench.options.Option``): the settings that do not change
what a run computes (``changes_results=False``: ``train.threads``, ``task.eval_batch_size``, ...) and those added
after runs were recorded without them, with the value those runs had (``added``).

A setting is named ``section.key`` whatever declares it: ``task.eval_batch_size`` is left out of every task's
runs when any task declares it so (as ``encoding.fire_init_l`` is one name for every encoding), so that a record
whose task or encoding is not installed compares as the others do. The declarers: ``ModelConfig``,
``TrainConfig``, every encoding and extension method (the ``encoding`` section) and every task, plugins
included.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from posbench.errors import ConfigError
from posbench.options import Added, Option, declared


@dataclass(frozen=True)
class SettingFacts:
    """``ignored``: the names of the settings that change how fast a run goes, not what it computes. ``added``:
    name -> ``Added(schema, before)``."""

    ignored: frozenset[str] = frozenset()
    added: dict[str, Added] = field(default_factory=dict)

    def counts(self, name: str, value: Any, schema_version: int) -> bool:
        """Whether the setting ``name`` at ``value`` sets a run of that record schema apart: not when it changes
        no result, nor when it was added later and holds the value every earlier run had."""
        if name in self.ignored:
            return False
        since = self.added.get(name)
        return since is None or schema_version < since.schema or since.before != value


def facts_of(owners: Iterable[tuple[str, Any]]) -> SettingFacts:
    """The facts of the options that each ``(section, owner)`` declares (``posbench.options.declared``)."""
    ignored: set[str] = set()
    added: dict[str, Added] = {}
    for section, owner in owners:
        for key, option in declared(owner).items():
            if not isinstance(option, Option):
                continue
            name = f"{section}.{key}"
            if not option.changes_results:
                ignored.add(name)
            if option.added is not None:
                if added.setdefault(name, option.added) != option.added:
                    raise ConfigError(f"{name} is declared added as {added[name]} and as {option.added} "
                                      f"({getattr(owner, '__qualname__', owner)}); declare one")
    return SettingFacts(frozenset(ignored), added)


def declared_owners() -> list[tuple[str, Any]]:
    """Every class that declares settings, with its section."""
    from posbench.hf.methods import METHODS
    from posbench.model.config import ModelConfig
    from posbench.registry import ENCODINGS
    from posbench.bench import Bench
    from posbench.tasks import TASKS
    from posbench.train.config import TrainConfig

    return [("model", ModelConfig), ("train", TrainConfig), *(("encoding", ENCODINGS[n]) for n in ENCODINGS),
            *(("encoding", METHODS[n]) for n in METHODS), *(("task", TASKS[n]) for n in TASKS), ("task", Bench)]


def declared_facts() -> SettingFacts:
    """The facts of every declaration (built-in and plugin): read once per ``compare``."""
    return facts_of(declared_owners())
