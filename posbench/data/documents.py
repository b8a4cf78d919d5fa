"""Reading the documents of one split of a text source as a stream that can stop and resume anywhere.

:class:`DocumentReader` yields the documents (non-empty strings) of a split in the source's fixed order and
reports, between any two documents, a JSON-able ``state()`` from which a new reader continues with exactly the
next document. The token cache stores that state with each commit, so a killed tokenisation resumes where it
stopped instead of starting over.

Every file is read with ``datasets``' own builders in streaming mode (``json``, ``parquet``, ``text``), one
file at a time, so memory never depends on a file's size. A hub data set read by name (a data-file
repository) is one ``datasets`` stream whose position is ``IterableDataset.state_dict()``.

Held-out documents: when a source has no held-out split of its own (files named validation/dev/test, or a hub
``validation`` split), document ``i`` of the training files (counting non-empty documents from 0) is held out
when ``i % holdout_every == 0``; the training split is every other document.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from posbench.data import corpus
from posbench.data.errors import DataError
from posbench.data.hub_env import WHAT_TO_PASS, datasets_library
from posbench.data.hub_errors import explain


class _FileCursor:
    """The rows of one file, opened on first use, ``rows`` of them already read."""

    def __init__(self, url: str, builder: str, field: str, rows: int = 0, chars: int = 0, label: str | None = None):
        self.url, self.builder, self.field = url, builder, field
        self.rows, self.chars = rows, chars
        self.label = label or url
        self._it: Iterator | None = None

    def _open(self) -> Iterator:
        datasets = datasets_library()
        kwargs: dict[str, Any] = {"sample_by": "document"} if self.builder == "text" else {}
        try:
            ds = datasets.load_dataset(self.builder, data_files=[self.url], split="train", streaming=True, **kwargs)
        except StopIteration:                  # an empty file: the json builder finds no first table
            return iter(())
        except Exception as exc:   # noqa: BLE001 - unreadable file or hub failure: one line
            raise read_error(exc, self.label) from None
        field = "text" if self.builder == "text" else self.field
        columns = ds.column_names
        if columns is not None:
            if field not in columns:
                raise DataError(f"{self.label} has no '{field}' field (columns: {', '.join(columns)}); "
                                f"pass --set task.text_field=NAME")
            if len(columns) > 1:
                ds = ds.select_columns([field])
        if self.rows:
            ds = ds.skip(self.rows)
        return self._values(ds, field)

    def _values(self, ds, field: str) -> Iterator:
        try:
            for row in ds:
                if field not in row:
                    raise DataError(f"{self.label} has no '{field}' field (columns: {', '.join(row)}); "
                                    f"pass --set task.text_field=NAME")
                yield row[field]
        except DataError:
            raise
        except Exception as exc:   # noqa: BLE001
            raise read_error(exc, self.label) from None

    def next(self) -> tuple[bool, Any]:
        """``(True, value)`` for the next row, ``(False, None)`` at the end of the file."""
        if self._it is None:
            self._it = self._open()
        try:
            value = next(self._it)
        except StopIteration:
            return False, None
        self.rows += 1
        if isinstance(value, str):
            self.chars += len(value)
        return True, value


def read_error(exc: BaseException, label: str) -> DataError:
    if label.startswith("hf://"):
        repo = "/".join(label[len("hf://"):].split("/")[1:3])
        message = explain(exc, repo, offline=WHAT_TO_PASS)
        if message:
            return DataError(message)
    first = str(exc).splitlines()[0] if str(exc) else ""
    return DataError(f"cannot read {label}: {type(exc).__name__}: {first}")


class DocumentReader:
    """The documents of ``split`` of ``source``; ``state()`` between documents, ``state=`` to resume."""

    def __init__(self, source, split: str, state: dict[str, Any] | None = None):
        if split not in ("train", "validation"):
            raise DataError(f"unknown split '{split}': use train or validation")
        self.source, self.split = source, split
        self._state = dict(state or {})
        self.index = int(self._state.get("index", 0))        # non-empty documents seen (both sides of a holdout)
        self._cursors: list[_FileCursor] = []
        self._sizes: list[int] = []
        self._done: list[bool] = []
        self._ds = None

    # ---- the position --------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self._cursors:
            out.update(rows=[c.rows for c in self._cursors], chars=[c.chars for c in self._cursors],
                       done=list(self._done))
        if self._ds is not None:
            out["ds"] = self._ds.state_dict()
        if "docs" in self._state or self.source.kind == "builtin":
            out["docs"] = self._state.get("docs", 0)
        return out

    # ---- reading -------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        kind = self.source.kind
        if kind == "builtin":
            yield from self._builtin()
            return
        plan = self.source.split_plan()
        held_out_slice = plan["validation"] == "held-out slice"
        want = self.split
        if kind == "local" or self.source.hub.builder:
            files = self.source.split_files("train" if held_out_slice else want)
            yield from self._select(self._files(files), held_out_slice)
        else:
            yield from self._select(self._hub_stream("train" if held_out_slice else want), held_out_slice)

    def _select(self, docs: Iterator[str], held_out_slice: bool) -> Iterator[str]:
        every = self.source.holdout_every
        for text in docs:
            index = self.index
            self.index += 1
            if not held_out_slice or ((index % every == 0) == (self.split == "validation")):
                yield text

    def _builtin(self) -> Iterator[str]:
        skip = int(self._state.get("docs", 0))
        for n, text in enumerate(corpus.stdlib_documents(self.split)):
            if n < skip:
                continue
            self._state["docs"] = n + 1
            yield text

    def _files(self, files: list[tuple[str, str, int]]) -> Iterator[str]:
        """Non-empty texts of ``(url, builder, size)`` files, one after the other or interleaved by size."""
        rows = self._state.get("rows") or [0] * len(files)
        chars = self._state.get("chars") or [0] * len(files)
        done = self._state.get("done") or [False] * len(files)
        if len(rows) != len(files):
            raise DataError(f"the files of '{self.source.spec}' changed since its token cache was written; "
                            f"delete the cache directory and run again")
        field = self.source.text_field
        self._cursors = [_FileCursor(url, builder, field, rows[i], chars[i], self.source.label(url))
                         for i, (url, builder, _) in enumerate(files)]
        self._sizes = [max(size, 1) for _, _, size in files]
        self._done = list(done)
        interleave = bool(self.source.hub is not None and self.source.hub.interleave)
        while True:
            open_files = [i for i, d in enumerate(self._done) if not d]
            if not open_files:
                return
            if interleave:   # the file least read relative to its size (ties: the first)
                i = min(open_files, key=lambda k: (self._cursors[k].chars / self._sizes[k], k))
            else:
                i = open_files[0]
            more, value = self._cursors[i].next()
            if not more:
                self._done[i] = True
                continue
            if isinstance(value, str) and value:
                yield value

    def _hub_stream(self, split: str) -> Iterator[str]:
        hub = self.source.hub
        datasets = datasets_library()
        try:
            ds = datasets.load_dataset(hub.repo, hub.config, split=split, streaming=True)
            if self._state.get("ds"):
                ds.load_state_dict(self._state["ds"])
        except Exception as exc:   # noqa: BLE001
            raise self.source.hub_error(exc) from None
        self._ds = ds
        field = self.source.text_field
        try:
            for row in ds:
                value = row.get(field)
                if value is None and field not in row:
                    raise DataError(f"hub data set '{hub.name}' has no '{field}' field (columns: {', '.join(row)}); "
                                    f"pass --set task.text_field=NAME")
                if isinstance(value, str) and value:
                    yield value
        except DataError:
            raise
        except Exception as exc:   # noqa: BLE001 - network, auth or missing-config errors
            raise self.source.hub_error(exc) from None
