"""Every hub name posbench advertises loads with today's datasets (4+): offline against stand-ins in the hub's
layout (the very code that reads the hub, pointed at a local directory), and for real with ``-m network``."""

import json
import socket

import pytest

from data_standins import write_hub_standins
from posbench.data import DataError, hub
from posbench.data.sources import looks_like_hub_name, open_source
from posbench.data.splits import check_splits

# alias -> (repository read, builder, the validation split: a split of its own or a held-out slice)
EXPECTED = {
    "c4": ("allenai/c4", "json", "split"),
    "allenai/c4": ("allenai/c4", "json", "split"),
    "allenai/c4:en": ("allenai/c4", "json", "split"),
    "pg19": ("emozilla/pg19", "parquet", "split"),
    "deepmind/pg19": ("emozilla/pg19", "parquet", "split"),
    "proof-pile": ("hoskinson-center/proof-pile", "json", "split"),
    "hoskinson-center/proof-pile": ("hoskinson-center/proof-pile", "json", "split"),
    "redpajama-sample": ("togethercomputer/RedPajama-Data-1T-Sample", "json", "held-out slice"),
    "togethercomputer/RedPajama-Data-1T-Sample": ("togethercomputer/RedPajama-Data-1T-Sample", "json",
                                                  "held-out slice"),
}
# every hub name the README, the help texts and the presets name (tau/scrolls is the scrolls task's)
ADVERTISED = ["c4", "allenai/c4", "allenai/c4:en", "pg19", "proof-pile",
              "togethercomputer/RedPajama-Data-1T-Sample"]


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory):
    """The stand-in repositories, written once for the module (the same files every time; the tests only read)."""
    root = tmp_path_factory.mktemp("hub")
    return root, write_hub_standins(root)


@pytest.fixture()
def standins(hub_files, monkeypatch):
    root, made = hub_files
    monkeypatch.setattr(hub, "HUB_ROOT", str(root))
    return made


@pytest.fixture()
def load_calls(monkeypatch):
    """Every datasets.load_dataset call (path and data files) made while reading."""
    import datasets

    calls = []
    real = datasets.load_dataset

    def spy(path, *args, **kwargs):
        calls.append((path, kwargs.get("data_files")))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    return calls


def test_every_advertised_name_is_resolved_by_posbench():
    assert set(ADVERTISED) <= set(EXPECTED)
    for name in hub.ALIASES:
        assert name in EXPECTED
    for script_repo in hub.SCRIPT_REPOS:
        spec = hub.resolve(script_repo)
        # a script repository is never loaded by name: posbench reads data files with a builder instead
        assert spec.builder in ("json", "parquet") or script_repo == "tau/scrolls"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_alias_resolves_to_data_files_that_datasets_reads(name, standins, load_calls):
    repo, builder, validation = EXPECTED[name]
    assert looks_like_hub_name(name)
    src = open_source(name)
    spec = src.hub
    assert (spec.repo, spec.builder) == (repo, builder)
    assert spec.repo.lower() not in hub.SCRIPT_REPOS or spec.builder is not None
    for split, patterns in spec.data_files.items():
        suffix = ".parquet" if builder == "parquet" else (".jsonl", ".json.gz", ".jsonl.gz")
        assert all(p.endswith(suffix) for p in patterns), patterns
    plan = check_splits(src)
    assert plan["validation"] == validation
    train = list(src.documents("train"))
    held_out = list(src.documents("validation"))
    files = standins[repo]
    if validation == "split":
        named = {"validation", "dev"}
        expected_val = [t for f, ts in files.items() for t in ts if any(w in f for w in named)]
        assert held_out == expected_val
        train_files = [f for f in files if "train" in f]
        assert sorted(train) == sorted(t for f in train_files for t in files[f])
    else:
        everything = [t for ts in files.values() for t in ts]
        assert sorted(train + held_out) == sorted(everything)
        assert len(held_out) == len(range(0, len(everything), src.holdout_every))
    # only builders ever reach datasets, with files of the repository: never the script repository by name
    assert load_calls and all(path == builder for path, _ in load_calls)
    assert all(f.startswith(hub.HUB_ROOT) and f"/{repo}/" in f for _, files_ in load_calls for f in files_)


def test_files_are_read_in_natural_order_and_redpajama_interleaved(standins):
    pp = open_source("proof-pile")
    names = [url.rsplit("/", 1)[1] for url, _, _ in pp.split_files("train")]
    assert names == ["proofpile_train_0.jsonl.gz", "proofpile_train_2.jsonl.gz", "proofpile_train_10.jsonl.gz"]
    assert list(pp.documents("train"))[:6] == standins["hoskinson-center/proof-pile"]["train/proofpile_train_0.jsonl.gz"]
    rp = open_source("redpajama-sample")
    docs = list(rp.documents("train")) + list(rp.documents("validation"))
    sources = ["arxiv" if d.startswith("arxiv") else "c4" for d in docs[:6]]
    assert set(sources) == {"arxiv", "c4"}                     # both files early, not one after the other


def test_a_script_repository_by_name_is_what_datasets_refuses(tmp_path):
    """Why posbench reads files: datasets >= 4 refuses a repository that holds its loading script."""
    import datasets

    repo = tmp_path / "pg19"
    repo.mkdir()
    (repo / "pg19.py").write_text("import datasets\n")
    with pytest.raises(RuntimeError, match="Dataset scripts are no longer supported"):
        datasets.load_dataset(str(repo), streaming=True)


def test_generic_names_go_to_datasets_and_scrolls_is_not_a_corpus(monkeypatch):
    spec = hub.resolve("HuggingFaceFW/fineweb:sample-10BT")
    assert (spec.repo, spec.config, spec.builder) == ("HuggingFaceFW/fineweb", "sample-10BT", None)
    assert hub.resolve("allenai/c4:realnewslike").builder is None          # another C4 config: by name
    with pytest.raises(DataError, match="scrolls task"):
        open_source("tau/scrolls")


def test_a_hub_data_set_without_validation_split_holds_out_a_slice(monkeypatch):
    """A data set read by name whose hub listing has no validation split (FineWeb) is found out before
    training, and holds out every 20th training document."""
    import datasets

    from posbench.data import hub_env, sources
    from posbench.data import tokenizer as data_tokenizer
    from posbench.hf import loading as hf_loading
    from posbench.tasks.scrolls import data as scrolls_data

    for module in (hub_env, sources, scrolls_data, data_tokenizer, hf_loading):  # each holds the name it imported
        monkeypatch.setattr(module, "hub_offline", lambda: False)
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda repo, config=None, **k: ["train"])
    rows = [{"text": f"doc {i}", "id": i} for i in range(45)]

    class Stream(list):
        def state_dict(self):
            return {}

    monkeypatch.setattr(datasets, "load_dataset", lambda path, config=None, split=None, streaming=False: Stream(rows))
    src = open_source("HuggingFaceFW/fineweb")
    plan = check_splits(src)
    assert plan["validation"] == "held-out slice" and "0 mod 20" in plan["rule"]
    assert list(src.documents("validation")) == ["doc 0", "doc 20", "doc 40"]
    assert len(list(src.documents("train"))) == 42
    assert "0 mod 20" in src.describe()["holdout"]


def test_offline_hub_names_still_say_what_to_pass(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for name in ("pg19", "redpajama-sample", "HuggingFaceFW/fineweb"):
        with pytest.raises(DataError) as err:
            check_splits(open_source(name))
        assert "offline" in str(err.value) and "--data PATH" in str(err.value) and "\n" not in str(err.value)


def _hub_reachable() -> bool:
    from posbench.data.hub_env import hub_offline

    if hub_offline():
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.network
@pytest.mark.parametrize("name", ["c4", "pg19", "proof-pile", "redpajama-sample"])
def test_alias_loads_a_few_rows_from_the_hub(name):
    """Opt-in: ``HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 pytest -m network tests/data/test_data_hub.py``."""
    if not _hub_reachable():
        pytest.skip("needs the Hugging Face hub: run with HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 -m network")
    src = open_source(name)
    check_splits(src)
    for split in ("train", "validation"):
        docs = []
        for text in src.documents(split):
            docs.append(text)
            if len(docs) == 2:
                break
        assert len(docs) == 2 and all(isinstance(d, str) and len(d) > 20 for d in docs)
    json.dumps(src.describe())
