"""The RULER retrieval tasks posbench generates, their parameters and defaults (RULER's ``scripts/synthetic.yaml``).

Parameter names are RULER's. RULER's ``essay`` haystack (Paul Graham essays, downloaded by a script) is
replaced by ``corpus``: lines of posbench's built-in corpus (CPython's standard-library sources), the natural,
non-repeating text posbench ships; ``noise`` (the grass is green...) and ``needle`` (a haystack of distractor
needles) are RULER's own.
"""

from __future__ import annotations

from typing import Any

from posbench.errors import UserError
from posbench.registry import UnknownNameError


class RulerError(UserError):
    """A bad RULER kind, parameter or length; ``str()`` is one line."""


HAYSTACKS = ("noise", "needle", "corpus")
NEEDLE_TYPES = ("numbers", "words", "uuids")

_NIAH = {"type_haystack": "corpus", "type_needle_k": "words", "type_needle_v": "numbers",
         "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}

# kind -> (family, defaults); RULER's essay -> corpus
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "niah_single_1": ("niah", {**_NIAH, "type_haystack": "noise"}),
    "niah_single_2": ("niah", dict(_NIAH)),
    "niah_single_3": ("niah", {**_NIAH, "type_needle_v": "uuids"}),
    "niah_multikey_1": ("niah", {**_NIAH, "num_needle_k": 4}),
    "niah_multikey_2": ("niah", {**_NIAH, "type_haystack": "needle"}),
    "niah_multikey_3": ("niah", {**_NIAH, "type_haystack": "needle", "type_needle_k": "uuids",
                                 "type_needle_v": "uuids"}),
    "niah_multivalue": ("niah", {**_NIAH, "num_needle_v": 4}),
    "niah_multiquery": ("niah", {**_NIAH, "num_needle_q": 4}),
    "vt": ("vt", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4, "add_fewshot": True,
                  "fewshot_length": 500}),
}

# RULER's generation budgets (constants.py ``tokens_to_generate``) and metrics (eval/synthetic/constants.py)
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30}
METRIC = {"niah": "string_match_all", "vt": "string_match_all"}


def family(kind: str) -> str:
    if kind not in KINDS:
        raise UnknownNameError("RULER kind", kind, list(KINDS))
    return KINDS[kind][0]


def defaults(kind: str) -> dict[str, Any]:
    family(kind)
    return dict(KINDS[kind][1])


def resolve(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The kind's defaults updated by ``params``, checked; one-line errors."""
    out = defaults(kind)
    unknown = sorted(set(params) - set(out))
    if unknown:
        raise RulerError(f"unknown parameter(s) {', '.join(unknown)} for RULER kind {kind}; valid: "
                         f"{', '.join(sorted(out))}")
    out.update(params)
    hay = out["type_haystack"]
    if hay == "essay":
        raise RulerError("RULER's essay haystack (Paul Graham essays) is not shipped; use type_haystack=corpus "
                         "(the built-in corpus) or noise")
    if hay not in HAYSTACKS or (family(kind) == "vt" and hay == "needle"):
        valid = HAYSTACKS if family(kind) == "niah" else ("noise", "corpus")
        raise RulerError(f"type_haystack must be one of {', '.join(valid)}, got {hay!r}")
    for name in ("type_needle_k", "type_needle_v"):
        if name in out and out[name] not in NEEDLE_TYPES:
            raise RulerError(f"{name} must be one of {', '.join(NEEDLE_TYPES)}, got {out[name]!r}")
    for name in ("num_needle_k", "num_needle_v", "num_needle_q", "num_chains", "fewshot_length"):
        if name in out and (not isinstance(out[name], int) or out[name] < 1):
            raise RulerError(f"{name} must be a positive integer, got {out[name]!r}")
    if "num_hops" in out and (not isinstance(out["num_hops"], int) or out["num_hops"] < 0):
        raise RulerError(f"num_hops must be an integer >= 0, got {out['num_hops']!r}")
    if "num_needle_q" in out:
        out["num_needle_k"] = max(out["num_needle_k"], out["num_needle_q"])     # as RULER's niah.py
    return out
