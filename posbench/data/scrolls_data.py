"""SCROLLS data: the seven data sets, local copies or the hub, duplicate ids merged, queries split.

Rows have the official schema ``id``, ``pid``, ``input``, ``output``. Several rows can share an ``id`` (one
per reference answer); like the official evaluator we keep the first row of each id and gather every
``output`` into ``outputs`` (in file order). For the query-based data sets the query is prepended to the
document with a blank line, so ``input`` is split at the first ``"\\n\\n"`` into ``question`` and ``text``.

``--data DIR`` points at local copies laid out as ``DIR/<dataset>/{train,validation}.jsonl`` (``.json``
and compressed variants work too). Without ``--data`` the hub data set ``tau/scrolls`` is read (its
per-data-set zip archives) when a network is there; offline that is a one-line error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.data.errors import DataError
from posbench.data.sources import _datasets, file_kind, hub_offline

DATASETS = ("gov_report", "summ_screen_fd", "qmsum", "narrative_qa", "qasper", "quality", "contract_nli")
QUERY_DATASETS = frozenset({"qmsum", "narrative_qa", "qasper", "quality", "contract_nli"})
SUMMARY_DATASETS = frozenset({"gov_report", "summ_screen_fd"})
HUB_NAME = "tau/scrolls"
FIELDS = ("id", "pid", "input", "output")

WHAT_TO_PASS = ("pass local copies with --data DIR laid out as DIR/<dataset>/{train,validation}.jsonl "
                "(rows with id, pid, input, output)")


@dataclass
class Example:
    id: str
    pid: str
    input: str
    outputs: list[str]
    question: str = ""          # query-based data sets only
    text: str = ""              # the document (the whole input for summaries)
    extra: dict[str, Any] = field(default_factory=dict)


def parse_datasets(value: str | list[str] | None) -> list[str]:
    """``--datasets a,b`` -> validated names in the official order; None or ``all`` -> all seven."""
    if value is None or value == "all" or value == ["all"]:
        return list(DATASETS)
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise DataError(f"unknown SCROLLS data set(s) {', '.join(unknown)}; valid: {', '.join(DATASETS)}")
    return [d for d in DATASETS if d in names]


def split_query(dataset: str, input_text: str) -> tuple[str, str]:
    """``(question, text)``: query tasks split at the first blank line; summaries have no question."""
    if dataset not in QUERY_DATASETS:
        return "", input_text
    idx = input_text.find("\n\n")
    if idx < 0:
        return input_text, ""
    return input_text[:idx], input_text[idx + 2:]


def merge_duplicates(rows: list[dict[str, Any]], dataset: str) -> list[Example]:
    """Keep the first row per id; collect every row's ``output`` into ``outputs``."""
    by_id: dict[str, Example] = {}
    for row in rows:
        missing = [f for f in ("id", "input") if f not in row]
        if missing:
            raise DataError(f"SCROLLS {dataset}: a row lacks {', '.join(missing)} (fields: {', '.join(row)})")
        key = str(row["id"])
        output = row.get("output")
        if key in by_id:
            if output is not None:
                by_id[key].outputs.append(str(output))
            continue
        question, text = split_query(dataset, str(row["input"]))
        by_id[key] = Example(id=key, pid=str(row.get("pid", key)), input=str(row["input"]),
                             outputs=[str(output)] if output is not None else [], question=question, text=text)
    return list(by_id.values())


def local_file(root: Path, dataset: str, split: str) -> Path:
    folder = root / dataset
    if not folder.is_dir():
        raise DataError(f"{root} has no {dataset}/ folder; {WHAT_TO_PASS}")
    candidates = sorted(p for p in folder.iterdir()
                        if p.is_file() and p.name.split(".")[0] == split and file_kind(p) == "json")
    if not candidates:
        raise DataError(f"no {dataset}/{split}.jsonl under {root}; {WHAT_TO_PASS}")
    return candidates[0]


def _read_rows_local(path: Path) -> list[dict[str, Any]]:
    datasets = _datasets()
    try:
        ds = datasets.load_dataset("json", data_files=[str(path)], split="train")
    except Exception as exc:   # noqa: BLE001
        raise DataError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    return ds.to_list()


def _read_rows_hub(dataset: str, split: str) -> list[dict[str, Any]]:
    if hub_offline():
        raise DataError(f"cannot load the hub data set {HUB_NAME} offline: {WHAT_TO_PASS}")
    datasets = _datasets()
    url = f"zip://{dataset}/{split}.jsonl::hf://datasets/{HUB_NAME}/{dataset}.zip"
    try:
        return datasets.load_dataset("json", data_files={split: url}, split=split).to_list()
    except Exception as exc:   # noqa: BLE001 - network or layout problems: one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DataError(f"cannot load {HUB_NAME} {dataset}/{split} ({type(exc).__name__}: {first}): "
                        f"{WHAT_TO_PASS}") from None


def load_split(dataset: str, split: str, data: str | Path | None = None) -> list[Example]:
    """Examples of one SCROLLS data set and split, duplicates merged."""
    if dataset not in DATASETS:
        raise DataError(f"unknown SCROLLS data set '{dataset}'; valid: {', '.join(DATASETS)}")
    if data is None or str(data) in (HUB_NAME, "scrolls"):
        rows = _read_rows_hub(dataset, split)
    else:
        root = Path(data).expanduser()
        if not root.is_dir():
            raise DataError(f"--data {data} is not a directory; {WHAT_TO_PASS}")
        rows = _read_rows_local(local_file(root, dataset, split))
    return merge_duplicates(rows, dataset)


def source_description(data: str | Path | None) -> dict[str, Any]:
    if data is None or str(data) in (HUB_NAME, "scrolls"):
        return {"kind": "hub", "name": HUB_NAME}
    return {"kind": "local", "root": str(Path(data).expanduser().resolve())}


# ------------------------------------------------------------------------------------------------------
# prompts (the lm-evaluation-harness SCROLLS formats; the answer follows after one space)

SUMMARY_QUESTION = "What is a summary of the preceding text?"


def prompt_parts(dataset: str, ex: Example) -> tuple[str, str]:
    """``(document, suffix)``: the prompt is ``document + suffix``; only the document is ever truncated."""
    if dataset in SUMMARY_DATASETS:
        return ex.text, f"\n\nQuestion: {SUMMARY_QUESTION}\nAnswer:"
    if dataset == "contract_nli":
        return ex.text, f"\n\nHypothesis: {ex.question}\nConclusion:"
    return ex.text, f"\n\nQuestion: {ex.question}\nAnswer:"
