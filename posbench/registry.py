"""One generic registry: names -> classes, filled by subclassing and by entry points.

Built-in classes register themselves when their module is imported (see ``__init_subclass__`` in
``encodings/base.py`` and ``tasks/base.py``). Third-party packages declare an entry point in a group such
as ``posbench.encodings``; those are loaded the first time the registry is read.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from posbench.errors import UserError

T = TypeVar("T")


class UnknownNameError(UserError, KeyError):
    """An unknown registry key. ``str()`` is a one-line message with the valid names."""

    def __init__(self, kind: str, name: str, valid: list[str]):
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        self.message = f"unknown {kind} '{name}'.{hint} Valid: {', '.join(sorted(valid))}."
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class Registry(Mapping[str, type], Generic[T]):
    """A read-mostly mapping of name -> class with duplicate checks and did-you-mean errors."""

    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._classes: dict[str, type] = {}
        self._origins: dict[str, str] = {}
        self._plugins_loaded = False

    def add(self, name: str, cls: type, origin: str = "built-in") -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        existing = self._classes.get(name)
        if existing is not None and existing is not cls:
            where = f"{existing.__module__}.{existing.__qualname__}"
            raise ValueError(f"{self.kind} name '{name}' is already registered by {where}")
        self._classes[name] = cls
        self._origins[name] = origin

    def add_subclass(self, cls: type) -> None:
        """Register a class that sets its own ``name`` (called from a base class's ``__init_subclass__``);
        classes without a name of their own (abstract intermediates) are skipped."""
        name = cls.__dict__.get("name")
        if name:
            builtin = cls.__module__.startswith("posbench.")
            self.add(name, cls, origin="built-in" if builtin else f"user ({cls.__module__})")

    def remove(self, name: str) -> None:
        """Unregister a name (used by tests and notebooks that redefine a class)."""
        self._classes.pop(name, None)
        self._origins.pop(name, None)

    def origin(self, name: str) -> str:
        self.get(name)
        return self._origins[name]

    def get(self, name: str) -> type:  # type: ignore[override]
        self._load_plugins()
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._classes)) from None

    def __getitem__(self, name: str) -> type:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        self._load_plugins()
        return iter(sorted(self._classes))

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._classes

    def _load_plugins(self) -> None:
        if self._plugins_loaded or self.entry_point_group is None:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            cls = ep.load()  # importing the module registers the class through subclassing
            name = getattr(cls, "name", ep.name) or ep.name
            dist = ep.dist.name if ep.dist is not None else ep.value
            if self._classes.get(name) is not cls:
                self.add(name, cls, origin=f"plugin ({dist})")
            else:
                self._origins[name] = f"plugin ({dist})"
