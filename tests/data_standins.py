"""Local stand-ins of hub data sets in the hub's own file layout (nothing is downloaded at test time).

``write_hub_standins(root)`` lays out, under ``root/<owner>/<name>/``, the files posbench reads for each alias
(``posbench.data.hub``), each with a few documents; tests point ``posbench.data.hub.HUB_ROOT`` at ``root`` so
the same reading code runs offline. ``write_c4(root, ...)`` writes a bigger C4 stand-in of generated English-
like text (``allenai/c4/en/c4-train.0000X-of-01024.json.gz``, ``c4-validation.0000X-of-00008.json.gz``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

#: the start of the scripts that measure a subprocess's memory: the repository on the path, and the process's
#: current (VmRSS) and peak (VmHWM) resident memory in MB. resource.getrusage(RUSAGE_SELF).ru_maxrss is no use
#: in a subprocess: Linux carries the parent's maximum across fork + exec (a child of a 1.5 GB pytest reports
#: 1.5 GB), so it is recorded beside VmHWM only.
MEASURE = """
import json, os, resource, sys, time
sys.path.insert(0, os.environ["POSBENCH_REPO"])

def _status_mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024

def rss_mb():
    return _status_mb("VmRSS")

def peak_mb():
    return _status_mb("VmHWM")
"""

SYLLABLES = ("ka", "to", "ri", "ne", "sa", "mo", "lu", "pe", "di", "ra", "vo", "shi", "en", "al", "or", "us",
             "th", "qu", "an", "el", "in", "ob", "ur", "ex")


def vocabulary(n: int = 6000, seed: int = 0) -> np.ndarray:
    """``n`` pseudo-words of 1-4 syllables, fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    words = set()
    while len(words) < n:
        k = int(rng.integers(1, 5))
        words.add("".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), k)))
    return np.array(sorted(words))


def documents(n_docs: int, seed: int, words: np.ndarray | None = None, mean_words: int = 400) -> list[str]:
    """Zipf-distributed words in sentences: a text a BPE learns something from."""
    words = vocabulary() if words is None else words
    listed = words.tolist()                       # Python strings: joined faster than numpy's, the same text
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.2, size=n_docs * mean_words * 2) - 1, len(words) - 1).tolist()
    out, pos = [], 0
    for _ in range(n_docs):
        n = int(rng.integers(mean_words // 4, mean_words * 7 // 4))
        chunk = [listed[r] for r in ranks[pos:pos + n]]
        pos += n
        sentences = [" ".join(chunk[i:i + 12]).capitalize() + "." for i in range(0, len(chunk), 12)]
        out.append(" ".join(sentences))
    return out


def _jsonl_gz(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _parquet(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)


def write_hub_standins(root: Path, docs_per_file: int = 6) -> dict[str, dict[str, list[str]]]:
    """The four aliased repositories in their hub layout; returns ``{repo: {file: [texts]}}``."""
    root = Path(root)
    made: dict[str, dict[str, list[str]]] = {}
    seed = [0]

    def texts(tag: str) -> list[str]:
        seed[0] += 1
        return [f"{tag} #{i}: " + d for i, d in enumerate(documents(docs_per_file, seed[0], mean_words=40))]

    c4 = root / "allenai" / "c4"
    made["allenai/c4"] = {}
    for name in ("en/c4-train.00000-of-01024.json.gz", "en/c4-train.00001-of-01024.json.gz",
                 "en/c4-validation.00000-of-00008.json.gz"):
        t = texts(name)
        _jsonl_gz(c4 / name, [{"text": x, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://e.x/{i}"}
                              for i, x in enumerate(t)])
        made["allenai/c4"][name] = t
    (c4 / "en" / "c4-train.00000-of-01024.json.gz.lock").write_text("")      # not a data file

    pg = root / "emozilla" / "pg19"
    made["emozilla/pg19"] = {}
    for name in ("data/train-00000-of-00023-5263dc4323e881d2.parquet", "data/train-00001-of-00023-2b13c68dbeba63b5.parquet",
                 "data/validation-00000-of-00001-aaaaaaaaaaaaaaaa.parquet", "data/test-00000-of-00001-29a571947c0b5ccc.parquet"):
        t = texts(name)
        _parquet(pg / name, [{"short_book_title": f"Book {i}", "publication_date": 1900 + i, "url": "u", "text": x}
                             for i, x in enumerate(t)])
        made["emozilla/pg19"][name] = t

    pp = root / "hoskinson-center" / "proof-pile"
    (pp / "proof-pile.py").parent.mkdir(parents=True, exist_ok=True)
    (pp / "proof-pile.py").write_text("import datasets  # a loading script: datasets >= 4 refuses it\n")
    made["hoskinson-center/proof-pile"] = {}
    for name in ("train/proofpile_train_0.jsonl.gz", "train/proofpile_train_2.jsonl.gz",
                 "train/proofpile_train_10.jsonl.gz", "dev/proofpile_dev.jsonl.gz", "test/proofpile_test.jsonl.gz"):
        t = texts(name)
        _jsonl_gz(pp / name, [{"text": x, "meta": json.dumps({"config": "arxiv", "file": i})} for i, x in enumerate(t)])
        made["hoskinson-center/proof-pile"][name] = t

    rp = root / "togethercomputer" / "RedPajama-Data-1T-Sample"
    (rp / "RedPajama-Data-1T-Sample.py").parent.mkdir(parents=True, exist_ok=True)
    (rp / "RedPajama-Data-1T-Sample.py").write_text("import datasets  # a loading script\n")
    made["togethercomputer/RedPajama-Data-1T-Sample"] = {}
    metas = {"arxiv_sample.jsonl": lambda i: {"arxiv_id": f"2301.{i:05d}", "language": "en"},
             "c4_sample.jsonl": lambda i: {"timestamp": "2019", "url": f"https://c4/{i}", "source": "c4"}}
    for name, meta in metas.items():
        t = texts(name)
        _jsonl(rp / name, [{"text": x, "meta": meta(i)} for i, x in enumerate(t)])
        made["togethercomputer/RedPajama-Data-1T-Sample"][name] = t
    return made


def write_c4(root: Path, train_files: int, docs_per_file: int, validation_docs: int = 400, seed: int = 0,
             mean_words: int = 400) -> Path:
    """A local copy of the hub repository allenai/c4's layout: ``root/allenai/c4/en/c4-train.0000X-of-01024.json.gz``
    and one validation shard ``c4-validation.00000-of-00008.json.gz``; returns ``root/allenai/c4/en``. With
    ``POSBENCH_HUB_ROOT=root`` (or ``posbench.data.hub.HUB_ROOT``) ``--data c4`` reads it."""
    words = vocabulary(seed=seed)
    base = Path(root) / "allenai" / "c4" / "en"
    for i in range(train_files):
        docs = documents(docs_per_file, seed * 1000 + i + 1, words, mean_words)
        _jsonl_gz(base / f"c4-train.{i:05d}-of-01024.json.gz",
                  [{"text": d, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://e.x/{i}/{j}"}
                   for j, d in enumerate(docs)])
    docs = documents(validation_docs, seed * 1000 + 999, words, mean_words)
    _jsonl_gz(base / "c4-validation.00000-of-00008.json.gz",
              [{"text": d, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://v.x/{j}"} for j, d in enumerate(docs)])
    return base


def write_scrolls_zip(path: Path, dataset: str, rows: int, doc_bytes: int, validation_rows: int = 60) -> Path:
    """The hub's archive layout ``<dataset>.zip`` holding ``<dataset>/train.jsonl`` (``rows`` rows of about
    ``doc_bytes`` characters each: very compressible text, so a multi-GB member makes a small zip) and
    ``<dataset>/validation.jsonl``; returns the zip's path."""
    import zipfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sentence = "The keeper of the lighthouse wrote down every ship that passed in the night. "
    body = sentence * (doc_bytes // len(sentence) + 1)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for split, n in (("train", rows), ("validation", validation_rows)):
            with z.open(f"{dataset}/{split}.jsonl", "w", force_zip64=True) as f:
                for i in range(n):
                    doc = f"Document {split} {i}. " + body[: doc_bytes]
                    for k in range(2 if i % 7 == 0 else 1):            # some ids have two references
                        row = {"id": f"{split}-{i}", "pid": f"{split}-{i}_{k}",
                               "input": f"Who kept the lighthouse in story {i}?\n\n{doc}", "output": f"keeper {k}"}
                        f.write((json.dumps(row) + "\n").encode())
    return path
