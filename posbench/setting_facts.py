"""What the declarations say about comparing runs (``posbench.options.Option``): the settings that do not change
what a run computes (``changes_results=False``: ``train.threads``, ``task.eval_batch_size``, ...) and those added
after runs were recorded without them, with the value those runs had (``added``).

A setting is named ``section.key`` whatever declares it: ``task.eval_batch_size`` is left out of every task's
runs when any task declares it so (as ``encoding.fire_init_l`` is one name for every encoding), so that a record
whose task or encoding is not installed compares as the others do. The declarers: ``ModelConfig``,
``TrainConfig``, every encoding and extension method (the ``encoding`` section), every task and the benchmark,
plugins included.

The built-in declarers' facts are read from ``posbench/catalog.py`` (generated from them: no torch); a class beyond
it (a plugin's, a file dropped into a folder, one defined in this process: ``registry.beyond_catalog``) is read from
the class itself. Below ``runs/`` and ``report/``: both read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from posbench import catalog, catalog_entry
from posbench.errors import ConfigError
from posbench.options import SYNONYMS, Added
from posbench.registry import beyond_catalog, built_in, registry_of

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

    def counted(self, sections: dict[str, dict[str, Any]], schema_version: int) -> dict[str, dict[str, Any]]:
        """By section, the settings of a record of that schema that set it apart (``counts``)."""
        return {section: {key: value for key, value in values.items()
                          if self.counts(f"{section}.{key}", value, schema_version)}
                for section, values in sections.items()}


def facts_of_owners(owners: Iterable[tuple[str, Any]]) -> SettingFacts:
    """The facts of the options that each ``(section, owner)`` declares (``catalog_entry.facts``)."""
    return merged((section, getattr(owner, "__qualname__", owner), catalog_entry.facts(owner))
                  for section, owner in owners)


def merged(declarers: Iterable[tuple[str, str, dict[str, Any]]]) -> SettingFacts:
    """The facts of ``(section, who, its facts)``: a setting ignored by any, added as one declares it (two
    declarations of one name added differently: one line, ``ConfigError``)."""
    ignored: set[str] = set()
    added: dict[str, Added] = {}
    for section, who, facts in declarers:
        ignored.update(f"{section}.{key}" for key in facts["ignored"])
        for key, (schema, before) in facts["added"].items():
            name, since = f"{section}.{key}", Added(schema, before)
            if added.setdefault(name, since) != since:
                raise ConfigError(f"{name} is declared added as {added[name]} and as {since} ({who}); declare one")
    return SettingFacts(frozenset(ignored), added)


#: the kinds of registered class that declare options (``posbench.registry``)
CLASS_KINDS = ("encoding", "method", "task")


def kind_facts(kind: str) -> dict[str, dict[str, Any]]:
    """name -> facts of every registered class of ``kind``: the catalog's, unless a class beyond it may be
    registered (then every class's own, imported)."""
    if not beyond_catalog(kind):
        return built_in(kind)
    registry = registry_of(kind)
    return {name: catalog_entry.facts(registry[name]) for name in registry}


class Declarations:
    """Every declaration's facts, each kind's read once when first asked for (built-in ones from the catalog, any
    other from its class: ``of_kind``): ``facts``, which settings count across them all, with the model's,
    training's and the benchmark's (``SettingFacts``); and a record's ``earlier`` values. What ``compare``,
    the claims and ``--resume`` ask of the declarations."""

    def __init__(self) -> None:
        self._kinds: dict[str, dict[str, dict[str, Any]]] = {}

    def of_kind(self, kind: str) -> dict[str, dict[str, Any]]:
        """name -> the facts of every registered class of ``kind`` (``kind_facts``), read once."""
        if kind not in self._kinds:
            self._kinds[kind] = kind_facts(kind)
        return self._kinds[kind]

    @cached_property
    def facts(self) -> SettingFacts:
        found = [("model", "ModelConfig", catalog.MODEL), ("train", "TrainConfig", catalog.TRAIN)]
        for kind in CLASS_KINDS:
            found += [(SYNONYMS.get(kind, kind), name, facts) for name, facts in self.of_kind(kind).items()]
        return merged([*found, ("task", "Bench", catalog.BENCH)])

    def earlier(self, encoding: str | None, task: str | None) -> dict[str, dict[str, Any]]:
        """By section (``model``, ``train``, ``encoding``, ``task``): the settings added after runs were recorded
        without them, each at the value those runs had (``Added.before``; T5's ``table_init``: x-transformers'
        before issue 47, T5's own since), from the declarations of a record's own classes: its encoding's options
        are its own (two encodings may declare one name, only one of them as added), and so are its task's. An
        encoding or task no registry holds gives nothing for its section."""
        owners = {"model": catalog.MODEL, "train": catalog.TRAIN, "encoding": self.of_kind("encoding").get(encoding),
                  "task": self.of_kind("task").get(task)}
        return {section: {name: before for name, (_, before) in facts["added"].items()}
                for section, facts in owners.items() if facts is not None}


def declared_facts() -> SettingFacts:
    """Which settings count, of every declaration (built-in and plugin): ``Declarations().facts``."""
    return Declarations().facts


def earlier_values(encoding: str | None, task: str | None) -> dict[str, dict[str, Any]]:
    """A record's earlier values (``Declarations.earlier``), for one record (``--resume``)."""
    return Declarations().earlier(encoding, task)


__all__ = ["Declarations", "SettingFacts", "declared_facts", "earlier_values", "facts_of_owners"]
