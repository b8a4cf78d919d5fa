"""What the catalog (``posbench/catalog.py``) says of one registered class, made from the class itself: its module,
description, defaults and comparing facts. ``posbench.catalog_build`` writes the catalog with it; ``posbench ls``
describes with it a class that is not in the catalog (a plugin's, a file dropped into a folder): one description
for both. Imports no class (no torch) itself."""

from __future__ import annotations

from typing import Any

from posbench.options import Option, declared


def facts(owner: Any) -> dict[str, Any]:
    """The comparing facts of one declarer: ``ignored`` keys and ``added`` key -> [schema, before]."""
    options = {k: o for k, o in declared(owner).items() if isinstance(o, Option)}
    return {"ignored": sorted(k for k, o in options.items() if not o.changes_results),
            "added": {k: [o.added.schema, o.added.before] for k, o in options.items() if o.added is not None}}


def summary_of(cls: Any) -> dict[str, Any]:
    """What the catalog says of one registered class: its module, description, defaults and facts (a task's
    version and presets are added by ``posbench.tasks.presets.catalog_summary``)."""
    return {"module": cls.__module__, "description": str(getattr(cls, "description", "") or ""),
            "defaults": dict(cls.defaults()), **facts(cls)}


def metric_entry(spec: Any) -> dict[str, Any]:
    """One metric declaration (``MetricSpec``) as the catalog holds it: its fields, by name."""
    return {"task": spec.task, "name": spec.name, "better": spec.better, "description": spec.description,
            "pool": spec.pool, "per_example": spec.per_example, "origin": spec.origin}
