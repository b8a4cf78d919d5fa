"""SCROLLS data: the seven data sets, local copies or the hub, duplicate ids merged, queries split, read as a
stream that stops at the budget.

Rows have the official schema ``id``, ``pid``, ``input``, ``output``. Several rows can share an ``id`` (one
per reference answer); like the official evaluator we keep the first row of each id and gather every
``output`` into ``outputs`` (in file order). For the query-based data sets the query is prepended to the
document with a blank line, so ``input`` is split at the first ``"\\n\\n"`` into ``question`` and ``text``.

Where the data is (``--data``, resolved by :func:`resolve_data`):

* nothing, ``tau/scrolls``, ``scrolls`` or ``hf://datasets/tau/scrolls``: the hub repository ``tau/scrolls``
  (a script repository, which ``datasets`` 4+ cannot load by name) read through its per-data-set archives
  ``<dataset>.zip`` with the ``json`` builder (``zip://<dataset>/<split>.jsonl::hf://datasets/tau/scrolls/
  <dataset>.zip``), streamed: only the member asked for is read, and only as far as needed;
* a directory ``DIR`` with ``DIR/<dataset>/{train,validation}.jsonl`` (``.json`` and compressed variants work
  too) or with the hub's own archives ``DIR/<dataset>.zip`` (``hf download tau/scrolls --repo-type dataset
  --local-dir DIR``). With ``task.datasets=all`` (the default) a directory that holds only some of the seven
  runs those (the task names the others in one line); a data set named in ``task.datasets`` must be there.

Reading stops at the budget (``limit`` examples: ``task.max_train_examples`` / ``max_eval_examples``), so
NarrativeQA's 8 GB archive is not read whole for 50 examples; a held-out split is still scanned to its end
for further references of the examples kept (nothing else is kept), so scores use every reference. With
``doc_chars`` only that many characters of each document are kept (from the side the prompt keeps), which is
all the scrolls task ever feeds the model; the full input's SHA-256 and length stay in ``extra``.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.data import hub
from posbench.data.errors import DataError
from posbench.data.hub_env import datasets_library, hub_offline
from posbench.data.hub_errors import explain
from posbench.data.progress import DataBar
from posbench.data.sources import file_kind

DATASETS = ("gov_report", "summ_screen_fd", "qmsum", "narrative_qa", "qasper", "quality", "contract_nli")
QUERY_DATASETS = frozenset({"qmsum", "narrative_qa", "qasper", "quality", "contract_nli"})
SUMMARY_DATASETS = frozenset({"gov_report", "summ_screen_fd"})
HUB_NAME = "tau/scrolls"
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


class _Merger:
    """Rows -> examples, first row per id kept, every row's ``output`` gathered (the official rule), optionally
    with the documents cut to ``doc_chars`` characters."""

    def __init__(self, dataset: str, doc_chars: int | None = None, doc_side: str = "end"):
        self.dataset, self.doc_chars, self.doc_side = dataset, doc_chars, doc_side
        self.by_id: dict[str, Example] = {}

    def add(self, row: dict[str, Any], new_ids: bool = True) -> Example | None:
        """Merge one row; with ``new_ids=False`` rows of ids not seen yet are dropped. The example a new id
        made, else None."""
        missing = [f for f in ("id", "input") if f not in row]
        if missing:
            raise DataError(f"SCROLLS {self.dataset}: a row lacks {', '.join(missing)} (fields: {', '.join(row)})")
        key = str(row["id"])
        output = row.get("output")
        known = self.by_id.get(key)
        if known is not None:
            if output is not None:
                known.outputs.append(str(output))
            return None
        if not new_ids:
            return None
        ex = self._example(key, row, output)
        self.by_id[key] = ex
        return ex

    def _example(self, key: str, row: dict[str, Any], output: Any) -> Example:
        full = str(row["input"])
        question, text = split_query(self.dataset, full)
        extra = {"input_sha256": hashlib.sha256(full.encode("utf-8")).hexdigest(), "input_chars": len(full)}
        input_text = full
        if self.doc_chars is not None and len(text) > self.doc_chars:
            text = text[: self.doc_chars] if self.doc_side == "end" else text[len(text) - self.doc_chars:]
            input_text = f"{question}\n\n{text}" if self.dataset in QUERY_DATASETS else text
            extra["doc_cut_to"] = self.doc_chars
        return Example(id=key, pid=str(row.get("pid", key)), input=input_text,
                       outputs=[str(output)] if output is not None else [], question=question, text=text,
                       extra=extra)


def split_digest(examples: list[Example]) -> str:
    """SHA-256 identifying the examples read: ids, the SHA-256 of each full input, and the references."""
    items = [(e.id, e.extra.get("input_sha256") or hashlib.sha256(e.input.encode("utf-8")).hexdigest(), e.outputs)
             for e in examples]
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


# ---- where the data is ---------------------------------------------------------------------------------------

HUB_SPELLINGS = ("", HUB_NAME, "scrolls", f"hf://datasets/{HUB_NAME}", f"datasets/{HUB_NAME}")


@dataclass(frozen=True)
class ScrollsData:
    """Where SCROLLS is read from: ``hub`` (``tau/scrolls``) or a local ``dir``."""

    kind: str
    root: Path | None = None

    def url(self, dataset: str, split: str) -> str:
        """What the ``json`` builder reads for one data set and split."""
        if self.kind == "hub":
            return f"zip://{dataset}/{split}.jsonl::{hub.HUB_ROOT.rstrip('/')}/{HUB_NAME}/{dataset}.zip"
        folder = self.root / dataset
        if folder.is_dir():
            return str(local_file(self.root, dataset, split))
        archive = self.root / f"{dataset}.zip"
        if archive.is_file():
            try:
                with zipfile.ZipFile(archive) as z:
                    names = z.namelist()
            except (OSError, zipfile.BadZipFile) as exc:
                raise DataError(f"cannot read {archive}: {exc}") from None
            member = next((n for n in names if n.split("/")[-1].split(".")[0] == split and file_kind(Path(n)) == "json"),
                          None)
            if member is None:
                raise DataError(f"{archive} has no {split}.jsonl; {WHAT_TO_PASS}")
            return f"zip://{member}::{archive.resolve()}"
        raise DataError(f"{self.root} has no {dataset}/ folder (nor {dataset}.zip); {WHAT_TO_PASS}")

    def holds(self, dataset: str) -> bool:
        """Whether the data set is there at all: the hub holds every one; a directory its folder or archive."""
        return self.kind == "hub" or (self.root / dataset).is_dir() or (self.root / f"{dataset}.zip").is_file()

    def check(self, datasets: list[str], splits: tuple[str, ...] = ("train", "validation")) -> None:
        """Every file is there before anything runs (the hub: not offline)."""
        if self.kind == "hub":
            if hub_offline() and hub.HUB_ROOT.startswith("hf://"):
                raise DataError(f"cannot load the hub data set {HUB_NAME} offline: {WHAT_TO_PASS}")
            return
        for dataset in datasets:
            for split in splits:
                self.url(dataset, split)

    def describe(self) -> dict[str, Any]:
        if self.kind == "hub":
            return {"kind": "hub", "name": HUB_NAME}
        return {"kind": "local", "root": str(self.root.resolve())}


def resolve_data(data: str | Path | None) -> ScrollsData:
    """``--data`` of the scrolls task (and ``posbench score``): the hub's ``tau/scrolls`` (nothing, ``tau/scrolls``,
    ``scrolls``, ``hf://datasets/tau/scrolls``) or a local directory of per-data-set folders or archives."""
    text = "" if data is None else str(data).strip()
    if text.rstrip("/") in HUB_SPELLINGS:
        return ScrollsData("hub")
    root = Path(text).expanduser()
    if not root.is_dir():
        raise DataError(f"--data {data} is neither a directory nor {HUB_NAME}; {WHAT_TO_PASS}")
    return ScrollsData("local", root)


def local_file(root: Path, dataset: str, split: str) -> Path:
    folder = root / dataset
    if not folder.is_dir():
        raise DataError(f"{root} has no {dataset}/ folder; {WHAT_TO_PASS}")
    candidates = sorted(p for p in folder.iterdir()
                        if p.is_file() and p.name.split(".")[0] == split and file_kind(p) == "json")
    if not candidates:
        raise DataError(f"no {dataset}/{split}.jsonl under {root}; {WHAT_TO_PASS}")
    return candidates[0]


def _rows(where: ScrollsData, dataset: str, split: str):
    """The rows of one file, streamed (``datasets``' json builder)."""
    url = where.url(dataset, split)
    datasets = datasets_library()
    try:
        ds = datasets.load_dataset("json", data_files={split: url}, split=split, streaming=True)
        yield from ds
    except DataError:
        raise
    except Exception as exc:   # noqa: BLE001 - network, auth or layout problems: one line
        if where.kind == "hub":
            message = explain(exc, HUB_NAME, offline=WHAT_TO_PASS)
            if message:
                raise DataError(message) from None
        first = str(exc).splitlines()[0] if str(exc) else ""
        name = f"{HUB_NAME} {dataset}/{split}" if where.kind == "hub" else url
        raise DataError(f"cannot load {name} ({type(exc).__name__}: {first}): {WHAT_TO_PASS}") from None


def load_split(dataset: str, split: str, data: str | Path | None = None, *, limit: int = 0,
               doc_chars: int | None = None, doc_side: str = "end", all_references: bool | None = None,
               ) -> list[Example]:
    """Examples of one SCROLLS data set and split, duplicates merged, read as a stream.

    ``limit`` > 0 stops after that many examples (the rows continuing the last one's id included);
    ``all_references`` (default: for every split but ``train``) then scans the rest of the file for further
    references of the examples kept, keeping nothing else. ``doc_chars`` keeps that many characters of each
    document, from its beginning (``doc_side="end"``: the end is cut) or from its end (``"start"``)."""
    if dataset not in DATASETS:
        raise DataError(f"unknown SCROLLS data set '{dataset}'; valid: {', '.join(DATASETS)}")
    where = resolve_data(data)
    where.check([dataset], (split,))
    if all_references is None:
        all_references = split != "train"
    merger = _Merger(dataset, doc_chars, doc_side)
    bar = DataBar(f"read SCROLLS {dataset}/{split}", limit or None, "examples", every=30.0)
    full = False
    last_id = None
    try:
        for row in _rows(where, dataset, split):
            if not full:
                made = merger.add(row)
                if made is not None:
                    last_id = made.id
                    bar.update(len(merger.by_id))
                if limit and len(merger.by_id) >= limit:
                    full = True
                continue
            if str(row.get("id")) == last_id:          # the last example's further references
                merger.add(row)
                continue
            if not all_references:
                break
            last_id = None
            merger.add(row, new_ids=False)
    finally:
        bar.close()
    return list(merger.by_id.values())


def source_description(data: str | Path | None) -> dict[str, Any]:
    return resolve_data(data).describe()


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
