"""What an unknown long option may have meant (``posbench.cli.app.main`` puts it in click's "Possible options")."""

from __future__ import annotations

import re
from typing import Any

MOST_MEANT = 6      # the most options a suggestion names


def meant(name: str, nearest: list[str], ctx: Any) -> list[str]:
    """What the unknown long option ``name`` may have meant, of the command line's options (its flags too) but those
    its help hides, best first: a name beginning the other (``--step``: ``--steps``), else sharing words
    (``--num-steps``), else initials (``--learning-rate``: ``--lr``), else help naming it (``--results``:
    ``--out``), else ``nearest``."""
    params = [param for param in ctx.command.get_params(ctx) if not getattr(param, "hidden", False)]
    options = [opt for param in params for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--")]
    typed = name.lstrip("-")
    for related in (begins, shares_words, initials):
        found = [option for option in options if related(typed, option.lstrip("-"))]
        if found:
            return found[:MOST_MEANT]
    return described(typed, params) or list(nearest)


def begins(typed: str, option: str) -> bool:
    """Whether one name begins the other at a word's end or in at least three letters (extend's ``--r``: none)."""
    short, long = sorted((typed, option), key=len)
    return short != long and long.startswith(short) and (len(short) >= 3 or long[len(short)] == "-")


def shares_words(typed: str, option: str) -> bool:
    a, b = set(typed.split("-")) - {""}, set(option.split("-")) - {""}
    return bool(a) and bool(b) and (a < b or b < a)


def initials(typed: str, option: str) -> bool:
    def spelled(words: str, letters: str) -> bool:
        parts = [w for w in words.split("-") if w]
        return len(parts) > 1 and "".join(w[0] for w in parts) == letters.replace("-", "")
    return spelled(typed, option) or spelled(option, typed)


def described(typed: str, params: list[Any]) -> list[str]:
    """The long options whose help has a word starting with ``typed`` (4 letters or more; ``results``: ``--out``)."""
    word = typed.replace("-", " ")
    if len(word) < 4:
        return []
    pattern = re.compile(rf"\b{re.escape(word)}", re.IGNORECASE)
    return [next(opt for opt in param.opts if opt.startswith("--")) for param in params
            if getattr(param, "help", None) and pattern.search(param.help)
            and any(opt.startswith("--") for opt in param.opts)][:3]
