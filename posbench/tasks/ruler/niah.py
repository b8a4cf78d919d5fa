"""Needle in a haystack with several keys, values and queries (RULER's ``scripts/data/synthetic/niah.py``).

``num_needle_k`` keys (RULER raises it to ``num_needle_q`` when smaller) get ``num_needle_v`` values each; every
(key, value) pair is one needle line ``One of the special magic {type_needle_v} for {key} is: {value}.``.
``num_needle_q`` keys are asked for (drawn without replacement, in the question in draw order); the answers are
all values of the asked keys, key by key. Needles of keys not asked for are distractors. With one asked value
(``q * v == 1``) the template is put in the singular as RULER does.

Placement: ``depth=None`` puts every needle at a random slot by the haystack's RULER rule, in random order.
A number ``depth`` puts the needles that hold answers (the *targets*) together, in random order, at the slot
nearest that depth; a list gives one depth per target. Distractors keep RULER's random rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posbench.tasks.ruler import templates
from posbench.tasks.ruler.haystack import NeedleFiller, nearest_slot, random_slots
from posbench.tasks.ruler.kinds import RulerError
from posbench.tasks.ruler.values import draw_distinct


def content(params: dict, rng: np.random.Generator, tokenizer, filler_for) -> dict:
    k, v, q = params["num_needle_k"], params["num_needle_v"], params["num_needle_q"]
    taken: set[str] = set()
    keys = draw_distinct(params["type_needle_k"], k, rng, taken)
    values = [draw_distinct(params["type_needle_v"], v, rng, taken) for _ in range(k)]
    asked = [int(i) for i in rng.choice(k, size=q, replace=False)]
    queries = [keys[i] for i in asked]
    answers = [value for i in asked for value in values[i]]
    lines, roles, owners = [], [], []
    for i, key in enumerate(keys):
        for value in values[i]:
            lines.append(templates.NEEDLE.format(type_needle_v=params["type_needle_v"], key=key, value=value))
            roles.append("target" if i in asked else "distractor")
            owners.append({"key": key, "value": value})
    head, tail = templates.niah_texts(params["type_needle_v"], queries, one_answer=q * v == 1)
    if params["type_haystack"] == "needle":
        filler = NeedleFiller(tokenizer, params["type_needle_k"], params["type_needle_v"], taken)
    else:
        filler = filler_for(params["type_haystack"])
    return {"head": head, "tail": tail, "lines": lines, "roles": roles, "needles": owners, "answers": answers,
            "answer_text": " " + ", ".join(answers), "filler": filler, "queries": queries}


def place(roles: list[str], depth: float | Sequence[float] | None, bounds: list[int], rng: np.random.Generator,
          rule: str) -> tuple[list[int], list[float]]:
    """``(slot, order key)`` of every needle line."""
    n = len(roles)
    slots, keys = [0] * n, [0.0] * n
    if depth is None:
        order = rng.permutation(n)
        for rank, (i, slot) in enumerate(zip(order, random_slots(n, bounds, rng, rule))):
            slots[int(i)], keys[int(i)] = slot, float(rank)
        return slots, keys
    targets = [i for i, r in enumerate(roles) if r == "target"]
    others = [i for i, r in enumerate(roles) if r != "target"]
    depths = [float(depth)] * len(targets) if np.isscalar(depth) else [float(d) for d in depth]
    if len(depths) != len(targets):
        raise RulerError(f"{len(depths)} depths given for {len(targets)} needles that hold answers")
    for rank, i in enumerate(rng.permutation(targets)):
        slots[int(i)], keys[int(i)] = nearest_slot(depths[rank], bounds), float(rank)
    order = rng.permutation(others) if others else []
    for i, slot in zip(order, random_slots(len(others), bounds, rng, rule)):
        slots[int(i)], keys[int(i)] = slot, float(rng.random()) * len(targets)
    return slots, keys
