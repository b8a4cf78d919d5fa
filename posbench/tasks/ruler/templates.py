"""RULER's prompt strings (NVIDIA/RULER ``scripts/data/synthetic/constants.py`` and the generators).

A RULER prompt is ``template + answer_prefix`` (``scripts/data/prepare.py`` appends the answer prefix, and
``scripts/pred/call_api.py`` sends ``input + answer_prefix`` to the model), with the ``base`` model template
(no chat wrapper). The context is ``"\\n".join(lines)`` for the line-based haystacks, so every prompt here is
``head + line_1 + "\\n" + ... + line_n + "\\n" + tail`` with ``head`` ending in the template's text before
``{context}`` and ``tail`` the text after ``{context}\\n`` (question and answer prefix).
"""

from __future__ import annotations

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# ---- needle in a haystack (niah.py) ---------------------------------------------------------------------
NIAH_HEAD = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize "
             "it. I will quiz you about the {type_needle_v} afterwards.\n")
NIAH_QUESTION = "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."

# ---- variable tracking (variable_tracking.py) ------------------------------------------------------------
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_ANSWER_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
                    "variables are assigned the value {query}, they are: ")
VT_VALUE = "VAR {name} = {value}"
VT_HOP = "VAR {name} = VAR {previous} "          # RULER's noise haystack keeps this trailing space


def singular(text: str) -> str:
    """RULER's rewrite of the niah template when one value is asked for (``num_needle_q * num_needle_v == 1``),
    applied, as there, before the names are filled in."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(old, new)
    return text


def query_list(queries: list[str]) -> str:
    """``a``, ``a, and b``, ``a, b, and c`` (RULER joins every query but the last with ``, `` then ``, and ``)."""
    return queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]


def niah_texts(type_needle_v: str, queries: list[str], one_answer: bool) -> tuple[str, str]:
    """``(head, tail)`` of a niah prompt."""
    head, tail = NIAH_HEAD, NIAH_QUESTION + NIAH_ANSWER_PREFIX
    noun = type_needle_v
    if one_answer:
        head, tail, noun = singular(head), singular(tail), type_needle_v[:-1]
    return head.format(type_needle_v=noun), tail.format(type_needle_v=noun, query=query_list(queries))


def vt_tail(value: str, num_v: int) -> str:
    return (VT_QUESTION + VT_ANSWER_PREFIX).format(query=value, num_v=num_v)
