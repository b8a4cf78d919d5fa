"""One generic registry: names -> classes, and the three ways a class gets into it.

A class registers itself when it is defined (``__init_subclass__`` in ``encodings/base.py``, ``tasks/base.py``,
``hf/methods.py``), so what matters is that its module is imported. That happens in one of three ways:

1. a file dropped into the package's folder (``posbench/encodings/``, ``posbench/tasks/``): the registry imports
   every module and sub-folder in it (``import_folder``) the first time it is asked for a name the catalog does not
   know, or for all its names;
2. an entry point of a group such as ``posbench.encodings``, declared by an installed package: loaded the first
   time the registry is read;
3. a module named by ``--plugins MODULE`` (a module name, or the path of a ``.py`` file) or by the environment
   variable ``POSBENCH_PLUGINS`` (several, comma-separated): imported the first time any registry is read
   (``load_plugins``), before the entry points.

Registries load lazily. ``posbench/catalog.py`` (generated from the classes, ``posbench.catalog_build``) says which
module defines each built-in name, so ``REGISTRY[name]`` imports that module alone; listing every name imports every
module of the folder. What needs no class (``posbench ls``'s listings, the facts ``compare`` reads from the
declarations) reads the catalog and imports nothing, unless a class beyond it may be registered
(``beyond_catalog``: a plugin named, an entry point, a file dropped into a folder, a class defined in this process).

A plugin that cannot be imported is one line (``PluginError``). What identifies the code of each plugin imported
(``loaded_plugins``: its module, its file and the SHA-256 of its source, read when it is imported) goes into the
record of every run made with it (``plugins`` in result.json), so that ``compare`` never pools runs of one name
whose code differs.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import pkgutil
import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

from posbench import catalog
from posbench.errors import UserError

T = TypeVar("T")

#: the environment variable naming plugin modules (comma-separated); ``--plugins`` adds to it
PLUGINS_VARIABLE = "POSBENCH_PLUGINS"


class UnknownNameError(UserError, KeyError):
    """An unknown registry key. ``str()`` is a one-line message with the valid names, then ``hint`` (a registry's:
    ``plugin_hint``)."""

    def __init__(self, kind: str, name: str, valid: list[str], hint: str = ""):
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        meant = f" Did you mean '{close[0]}'?" if close else ""
        self.message = f"unknown {kind} '{name}'.{meant} Valid: {', '.join(sorted(valid))}.{hint}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def plugin_hint(command: str = "COMMAND ...") -> str:
    """The sentence every unknown name of a registry ends with (a name typed, or read from a run's record by
    ``export``, ``analyze``, ``--resume``...): it may be a plugin's, which is imported only when named. ``command``:
    the command to show it named in (``check NAME``)."""
    return (f" One of a plugin's? posbench imports a plugin only when told: posbench --plugins FILE.py {command} "
            f"(or {PLUGINS_VARIABLE}=FILE.py).")


class PluginError(UserError):
    """A plugin module (or a file dropped into a folder) that cannot be imported; ``str()`` is one line."""


# ---- importing what registers --------------------------------------------------------------------------------

_loaded_plugins: set[str] = set()
_plugin_code: dict[str, dict[str, str | None]] = {}    # module -> what identifies its code (``loaded_plugins``)
_entry_classes: dict[str, tuple] = {}                   # an entry point's module -> (registry (weakly), name, class)
_importing: list[str] = []          # the plugin module being imported (what its classes' origin names)


def import_folder(package: str, folder: Iterable[str]) -> None:
    """Import every module and sub-folder of ``package`` (its ``__path__`` is ``folder``), and every module of each
    sub-folder, whose name does not start with an underscore: a file or a folder dropped there registers its
    classes (a task's folder need not import its ``task.py`` in its ``__init__.py``; the built-in ones do not)."""
    for info in sorted(pkgutil.iter_modules(folder), key=lambda i: i.name):
        if not info.name.startswith("_"):
            name = f"{package}.{info.name}"
            try:
                module = importlib.import_module(name)
            except UserError:
                raise
            except Exception as exc:  # noqa: BLE001  (a user's file: say which, in one line)
                raise PluginError(f"cannot import {name} ({type(exc).__name__}: {exc})") from exc
            if info.ispkg:
                import_folder(name, module.__path__)


def plugin_names(value: str | None) -> list[str]:
    """``"a, b.c"`` -> ``["a", "b.c"]``."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def add_plugins(names: Iterable[str]) -> None:
    """Name more plugin modules (``--plugins``): imported now, and kept in ``POSBENCH_PLUGINS`` so that the
    processes this one starts (torchrun's) import them too."""
    names = [n for n in names if n]
    load_plugins(names)
    current = plugin_names(os.environ.get(PLUGINS_VARIABLE))
    if names:
        os.environ[PLUGINS_VARIABLE] = ",".join(current + [n for n in names if n not in current])


def load_plugins(names: Iterable[str] | None = None) -> None:
    """Import each plugin module once (default: those ``POSBENCH_PLUGINS`` names). A name ending in ``.py`` is
    a file, imported under its stem; any other is a module name, looked up on ``sys.path`` and in the working
    directory."""
    for name in plugin_names(os.environ.get(PLUGINS_VARIABLE)) if names is None else names:
        if name in _loaded_plugins:
            continue
        _loaded_plugins.add(name)
        with _origin(Path(name).stem if name.endswith(".py") else name):
            try:
                _import_plugin(name)
            except UserError:
                raise
            except Exception as exc:  # noqa: BLE001
                _loaded_plugins.discard(name)
                raise PluginError(f"plugin {name!r} cannot be imported ({type(exc).__name__}: {exc})") from exc


def _import_plugin(name: str) -> None:
    if name.endswith(".py"):
        path = Path(name).resolve()
        if not path.is_file():
            raise PluginError(f"plugin {name!r}: no such file")
        other = sys.modules.get(path.stem)
        if other is not None:
            where = getattr(other, "__file__", None) or "built into Python"
            raise PluginError(f"plugin {name!r}: a module named {path.stem!r} is already imported ({where}); "
                              f"rename the file")
        source = path.read_bytes()               # what runs is what is hashed (never a stale bytecode cache)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module          # a real module: pickling and FlexAttention's tracing import it
        try:
            exec(compile(source, str(path), "exec"), module.__dict__)
        except BaseException:
            sys.modules.pop(path.stem, None)
            raise
        _plugin_code[path.stem] = {"module": path.stem, "file": str(path),
                                   "sha256": hashlib.sha256(source).hexdigest()}
        return
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())               # as ``python -m`` would: a module beside the user
    module = importlib.import_module(name)
    _plugin_code[name] = {"module": name, **source_of(module)}


def source_of(module: object) -> dict[str, str | None]:
    """The file of an imported module and the SHA-256 of its source: of its file, or for a package of every
    ``.py`` file under its folder (each path relative to it, then its bytes); None where it has no file."""
    file = getattr(module, "__file__", None)
    if not file:
        return {"file": None, "sha256": None}
    path = Path(file).resolve()
    if not hasattr(module, "__path__"):
        return {"file": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    digest = hashlib.sha256()
    for each in sorted(path.parent.rglob("*.py")):
        digest.update(str(each.relative_to(path.parent)).encode() + b"\0" + each.read_bytes() + b"\0")
    return {"file": str(path.parent), "sha256": digest.hexdigest()}


def loaded_plugins() -> list[dict[str, str | None]]:
    """What identifies the code of every plugin this process imported (``--plugins``, ``POSBENCH_PLUGINS``, an
    entry point), by module: ``{"module", "file", "sha256"}`` (an entry point's also ``entry_point`` and
    ``distribution``); empty when there is none. The source is read when the plugin is imported; a plugin undone
    since (its module removed from ``sys.modules``, an entry point's class from its registry: tests do) is not
    one any more."""
    def held(module: str) -> bool:
        if module not in _entry_classes:
            return module in sys.modules
        registry, name, cls = _entry_classes[module]
        return registry() is not None and registry()._classes.get(name) is cls

    return [dict(_plugin_code[name]) for name in sorted(_plugin_code) if held(name)]


@contextmanager
def _origin(module: str):
    _importing.append(module)
    try:
        yield
    finally:
        _importing.pop()


# ---- the registry -------------------------------------------------------------------------------------------

def origin_of(module: str) -> str:
    """Where a class of ``module`` comes from: "plugin (NAME)" while a plugin is imported; "built-in" for a module
    posbench ships (its package lists it in ``SHIPPED``); "added to posbench (FILE)" for another file dropped into
    posbench's folders; else "user (MODULE)"."""
    plugin = next((p for p in reversed(_importing) if module == p or module.startswith(f"{p}.")), None)
    if plugin is not None:
        return f"plugin ({plugin})"
    if not module.startswith("posbench."):
        return f"user ({module})"
    parts = module.split(".")
    shipped = getattr(sys.modules.get(".".join(parts[:2])), "SHIPPED", None)
    if shipped is None or len(parts) < 3 or parts[2] in shipped:
        return "built-in"
    return f"added to posbench ({'/'.join(parts[:3])})"


class Registry(Mapping[str, type], Generic[T]):
    """A read-mostly mapping of name -> class with duplicate checks and did-you-mean errors."""

    def __init__(self, kind: str, entry_point_group: str | None = None, package: str | None = None):
        """``package``: the package whose modules register the built-in classes. A name the catalog knows imports
        its own module when it is first looked up; listing every name, or a name the catalog does not know,
        imports the whole folder (``_load_all``). So a module can look a name up without importing the package
        itself (the model asks for an encoding; the encodings import the model)."""
        self.kind = kind
        where = KINDS.get(kind)                 # a kind posbench knows: its folder and group, from one table
        self.entry_point_group = entry_point_group or (where.entry_point_group if where else None)
        self.package = package or (where.package if where else None)
        self._classes: dict[str, type] = {}
        self._origins: dict[str, str] = {}
        self._plugins_loaded = False          # plugins and entry points
        self._all_loaded = False              # and every module of the package's folder

    def add(self, name: str, cls: type, origin: str = "built-in") -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        existing = self._classes.get(name)
        shipped = built_in_module(self.kind, name)
        if existing is None and shipped is not None and shipped != cls.__module__:
            importlib.import_module(shipped)    # the built-in of that name registers first: no plugin replaces it
            existing = self._classes.get(name)
        if existing is not None and existing is not cls:
            where = f"{existing.__module__}.{existing.__qualname__}"
            raise ValueError(f"{self.kind} name '{name}' is already registered by {where}")
        self._classes[name] = cls
        self._origins[name] = origin

    def add_subclass(self, cls: type) -> None:
        """Register a class that sets its own ``name`` (called from a base class's ``__init_subclass__``). A class
        without a name of its own is refused (it would never be found: "unknown encoding" later), unless it says
        ``abstract = True`` (a base class meant only to be subclassed). Its origin: a plugin, a module shipped with
        posbench ("built-in": named in its package's ``SHIPPED``), a file added to posbench's folders, or the
        user's own module."""
        name = cls.__dict__.get("name")
        if not name:
            if cls.__dict__.get("abstract"):
                return
            raise TypeError(f"{self.kind} class {cls.__module__}.{cls.__qualname__} has no name: set name = '...' "
                            f"(a base class meant only to be subclassed sets abstract = True)")
        self.add(name, cls, origin=origin_of(cls.__module__))

    def remove(self, name: str) -> None:
        """Unregister a name (used by tests and notebooks that redefine a class)."""
        self._classes.pop(name, None)
        self._origins.pop(name, None)

    def origin(self, name: str) -> str:
        self.get(name)
        return self._origins[name]

    def get(self, name: str) -> type:  # type: ignore[override]
        """The class of ``name``: a built-in one's module is imported alone (the catalog names it); any other name
        imports the package's whole folder first."""
        self._load_plugins()
        if name not in self._classes:
            module = built_in_module(self.kind, name)
            if module is not None:
                importlib.import_module(module)
        if name not in self._classes:
            self._load_all()
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._classes), plugin_hint()) from None

    def __getitem__(self, name: str) -> type:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        self._load_all()
        return iter(sorted(self._classes))

    def __len__(self) -> int:
        self._load_all()
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        if name not in self._classes and isinstance(name, str) and built_in_module(self.kind, name) is not None:
            return True
        if name not in self._classes:
            self._load_all()
        return name in self._classes

    def _load_all(self) -> None:
        """Every class: the plugins, the entry points and every module of the package's folder."""
        self._load_plugins()
        if self._all_loaded:
            return
        self._all_loaded = True
        try:
            if self.package is not None:
                package = importlib.import_module(self.package)
                import_folder(self.package, package.__path__)
        except Exception:
            self._all_loaded = False
            raise

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True          # first: a plugin's module reads the registry while it is imported
        try:
            load_plugins()
            self._load_entry_points()
        except Exception:
            self._plugins_loaded = False
            raise

    def _load_entry_points(self) -> None:
        if self.entry_point_group is None:
            return
        for ep in entry_points(group=self.entry_point_group):
            try:
                cls = ep.load()  # importing the module registers the class through subclassing
            except Exception as exc:  # noqa: BLE001
                raise PluginError(f"entry point {ep.name!r} of group {self.entry_point_group} cannot be loaded "
                                  f"({type(exc).__name__}: {exc})") from exc
            name = getattr(cls, "name", ep.name) or ep.name
            dist = ep.dist.name if ep.dist is not None else ep.value
            module = str(getattr(cls, "__module__", "") or ep.value.split(":")[0])     # where the class is
            version = getattr(ep.dist, "version", None)
            _plugin_code.setdefault(module, {
                "module": module, "entry_point": f"{self.entry_point_group}:{ep.name}",
                "distribution": f"{dist} {version}" if version else dist, **source_of(sys.modules.get(module))})
            _entry_classes.setdefault(module, (weakref.ref(self), name, cls))
            if self._classes.get(name) is not cls:
                self.add(name, cls, origin=f"plugin ({dist})")
            else:
                self._origins[name] = f"plugin ({dist})"


# ---- what the catalog knows, and what lies beyond it --------------------------------------------------------

class Kind(NamedTuple):
    """Where a kind of class is registered: the module that defines its registry (``attribute``), the package whose
    folder holds the built-in ones (None: no folder), its entry-point group and its table in ``posbench.catalog``."""

    module: str
    attribute: str
    package: str | None
    entry_point_group: str | None
    table: str


KINDS = {"encoding": Kind("posbench.registry", "ENCODINGS", "posbench.encodings", "posbench.encodings", "ENCODINGS"),
         "task": Kind("posbench.tasks.base", "TASKS", "posbench.tasks", "posbench.tasks", "TASKS"),
         "method": Kind("posbench.hf.methods", "METHODS", None, None, "METHODS")}


def built_in(kind: str) -> dict[str, dict]:
    """The catalog's entries of a kind: name -> its module, description, defaults and facts."""
    return getattr(catalog, KINDS[kind].table)


def built_in_module(kind: str, name: str) -> str | None:
    entry = built_in(kind).get(name) if kind in KINDS else None
    return entry["module"] if entry is not None else None


def registry_of(kind: str) -> Registry:
    """The registry of a kind, every class in it (importing the modules that register them: torch)."""
    where = KINDS[kind]
    registry = getattr(importlib.import_module(where.module), where.attribute)
    registry._load_all()
    return registry


def beyond_catalog(kind: str) -> bool:
    """Whether a class of ``kind`` the catalog does not describe may be registered: a plugin is named
    (``POSBENCH_PLUGINS``, ``--plugins``), an entry point of its group is installed, a module not shipped lies in
    its folder, or a class this process defined (a notebook's, a test's) is registered. Then the registry itself
    must be read; else the catalog says everything."""
    where = KINDS[kind]
    if plugin_names(os.environ.get(PLUGINS_VARIABLE)) or _loaded_plugins:
        return True
    if where.entry_point_group is not None and entry_points(group=where.entry_point_group):
        return True
    if where.package is not None:
        spec = importlib.util.find_spec(where.package)
        shipped = catalog.SHIPPED[where.package]
        if any(not i.name.startswith("_") and i.name not in shipped
               for i in pkgutil.iter_modules(spec.submodule_search_locations or [])):
            return True
    defined = sys.modules.get(where.module)
    registry = getattr(defined, where.attribute, None) if defined is not None else None
    known = built_in(kind)
    return registry is not None and any(name not in known or cls.__module__ != known[name]["module"]
                                        for name, cls in registry._classes.items())


#: the positional encodings: each built-in one registers when its module is imported, at the first lookup of its
#: name (``posbench.catalog`` says which module); defined here, below both the model and the encodings, so that
#: the model looks an encoding up without importing the encodings, which import the model
ENCODINGS: Registry = Registry("encoding")
