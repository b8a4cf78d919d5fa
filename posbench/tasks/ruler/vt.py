"""Variable tracking (RULER's ``scripts/data/synthetic/variable_tracking.py``).

``num_chains`` chains of ``num_hops + 1`` statements: ``VAR X0 = 12345`` then ``VAR X1 = VAR X0 `` ... (names of
5 upper-case letters, all distinct; values of 5 digits, distinct across chains). The question asks for every
variable bound to the first chain's value; the answer is that chain's ``num_hops + 1`` names, in chain order.

With ``add_fewshot`` (RULER's default) the prompt starts with one solved example, as RULER's
``randomize_icl``: a whole variable-tracking prompt of ``fewshot_length`` tokens with 3-letter names,
``min(num_hops, 10)`` hops and its own value, followed by ``" " + " ".join(names) + "\\n"`` and ``"\\n"``.

Placement: statements keep their chain's order. ``depth=None``: the chains are interleaved at random and
take sorted random slots by the haystack's RULER rule. A number ``depth`` puts the first chain's first
statement (the value) at the slot nearest that depth and its hops at random slots after it; a list gives
one depth per statement of the first chain (non-decreasing). Other chains keep the random rule.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

import numpy as np

from posbench.tasks.ruler import templates
from posbench.tasks.ruler.haystack import nearest_slot, random_slots
from posbench.tasks.ruler.kinds import RulerError

LETTERS = np.array(list(string.ascii_uppercase))


def _names(n: int, width: int, rng: np.random.Generator) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = "".join(LETTERS[rng.integers(0, 26, size=width)])
        if name not in out and name != "VAR":
            out.append(name)
    return out


def _values(n: int, rng: np.random.Generator, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        value = str(int(rng.integers(10000, 99999)))          # np.random.randint(10000, 99999)
        if value not in taken:
            taken.add(value)
            out.append(value)
    return out


def chains(num_chains: int, num_hops: int, width: int, rng: np.random.Generator, taken: set[str]
           ) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """``(names per chain, statement lines per chain, value per chain)``."""
    names = _names(num_chains * (num_hops + 1), width, rng)
    values = _values(num_chains, rng, taken)
    per_chain = [names[c * (num_hops + 1):(c + 1) * (num_hops + 1)] for c in range(num_chains)]
    lines = [[templates.VT_VALUE.format(name=ns[0], value=values[c])]
             + [templates.VT_HOP.format(name=ns[j + 1], previous=ns[j]) for j in range(num_hops)]
             for c, ns in enumerate(per_chain)]
    return per_chain, lines, values


def content(params: dict, rng: np.random.Generator, tokenizer, filler_for,
            build: Callable[[dict, int, np.random.Generator], list[int]], taken: set[str] | None = None,
            icl: bool = False) -> dict:
    """The prompt's parts; ``build(parts, length, rng)`` assembles a whole prompt (for the solved example)."""
    taken = set() if taken is None else taken
    hops = min(params["num_hops"], 10) if icl else params["num_hops"]
    names, lines, values = chains(params["num_chains"], hops, 3 if icl else 5, rng, taken)
    head = tokenizer.encode(templates.VT_HEAD)
    meta: dict = {}
    if params["add_fewshot"] and not icl:
        shot = content(params, rng, tokenizer, filler_for, build, taken, icl=True)
        suffix = tokenizer.encode(shot["answer_text"] + "\n\n")
        try:
            shot_ids = build(shot, params["fewshot_length"] - len(suffix), rng)
        except RulerError:
            raise RulerError(f"fewshot_length {params['fewshot_length']} is too short for the solved example "
                             f"(add_fewshot) with this tokenizer; raise it or set add_fewshot=False") from None
        head = shot_ids + suffix + head
        meta["fewshot"] = {"tokens": len(shot_ids) + len(suffix), "value": shot["query"],
                           "answers": shot["answers"]}
    flat = [line for chain in lines for line in chain]
    roles = [f"chain{c}" for c, chain in enumerate(lines) for _ in chain]
    return {"head_ids": head, "tail": templates.vt_tail(values[0], hops + 1), "lines": flat, "roles": roles,
            "answers": list(names[0]), "answer_text": " " + " ".join(names[0]), "query": values[0],
            "filler": filler_for(params["type_haystack"]), "shape": (params["num_chains"], hops + 1),
            "chains": [{"names": ns, "value": v} for ns, v in zip(names, values)], **meta}


def place(shape: tuple[int, int], depth: float | Sequence[float] | None, bounds: list[int],
          rng: np.random.Generator, rule: str) -> tuple[list[int], list[float]]:
    """``(slot, order key)`` of every statement (chain-major order)."""
    n_chains, per = shape
    slots, keys = [0] * (n_chains * per), [0.0] * (n_chains * per)
    free = list(range(n_chains))
    if depth is not None:
        free = free[1:]
        depths = list(depth) if not np.isscalar(depth) else None
        if depths is not None and (len(depths) != per or any(b < a for a, b in zip(depths, depths[1:]))):
            raise RulerError(f"give one non-decreasing depth per statement of the first chain ({per})")
        if depths is None:
            first = nearest_slot(float(depth), bounds)
            chain0 = [first] + sorted(int(s) for s in rng.integers(first, len(bounds), size=per - 1))
        else:
            chain0 = [nearest_slot(float(d), bounds) for d in depths]
        for j, slot in enumerate(chain0):
            slots[j], keys[j] = slot, float(j)
    # the other chains: a random interleaving (each chain's order kept) over sorted random slots
    sequence = [c for c in free for _ in range(per)]
    sequence = [sequence[int(i)] for i in rng.permutation(len(sequence))]
    taken_in_chain = {c: 0 for c in free}
    for rank, (c, slot) in enumerate(zip(sequence, random_slots(len(sequence), bounds, rng, rule))):
        i = c * per + taken_in_chain[c]
        taken_in_chain[c] += 1
        slots[i], keys[i] = slot, float(per + rank)
    return slots, keys
