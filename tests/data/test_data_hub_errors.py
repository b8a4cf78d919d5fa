"""Hub failures keep their meaning: a gated or missing repository (data set or model) says so and what to do, in
one line (the libraries' real exception types, raised by monkeypatched calls; nothing touches the network)."""

import httpx2
import pytest
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from posbench.cli import main
from posbench.data import DataError, hub, hub_env, sources
from posbench.data import tokenizer as data_tokenizer
from posbench.data.hub_errors import explain, kind_of
from posbench.data.sources import open_source
from posbench.data.splits import check_splits
from posbench.hf import loading as hf_loading
from posbench.tasks.scrolls import data as scrolls_data


def _response(code: int, url: str = "https://huggingface.co/api/x"):
    return httpx2.Response(code, request=httpx2.Request("GET", url))


def gated() -> GatedRepoError:
    return GatedRepoError("401 Client Error. Cannot access gated repo for url https://huggingface.co/x/resolve/main/"
                          "config.json.\nAccess to model x is restricted.", response=_response(401))


def missing() -> RepositoryNotFoundError:
    return RepositoryNotFoundError("404 Client Error. Repository Not Found for url https://huggingface.co/x",
                                   response=_response(404))


def wrapped(inner: BaseException, message: str) -> OSError:
    """How transformers reports it: an OSError raised from the hub's exception."""
    try:
        raise inner
    except BaseException as exc:   # noqa: BLE001
        try:
            raise OSError(message) from exc
        except OSError as outer:
            return outer


@pytest.fixture()
def online(monkeypatch):
    for module in (hub_env, sources, scrolls_data, data_tokenizer, hf_loading):  # each holds the name it imported
        monkeypatch.setattr(module, "hub_offline", lambda: False)


def _one_line(text: str) -> str:
    assert "\n" not in text
    return text


def test_the_kinds_from_types_and_from_the_wrappers_words():
    assert kind_of(gated()) == "gated" and kind_of(missing()) == "missing"
    assert kind_of(wrapped(gated(), "You are trying to access a gated repo.\nMake sure...")) == "gated"
    assert kind_of(DatasetNotFoundError("Dataset 'a/b' is a gated dataset on the Hub. You must be authenticated "
                                        "to access it.")) == "gated"
    assert kind_of(DatasetNotFoundError("Dataset 'a/b' doesn't exist on the Hub or cannot be accessed.")) == "missing"
    assert kind_of(RuntimeError("Dataset scripts are no longer supported, but found pg19.py")) == "script"
    assert kind_of(ConnectionError("Couldn't reach 'a/b' on the Hub (LocalEntryNotFoundError)")) == "offline"
    from huggingface_hub.errors import LocalEntryNotFoundError

    assert kind_of(wrapped(LocalEntryNotFoundError("not cached, offline"), "We couldn't connect to the hub")) == "offline"
    assert explain(LocalEntryNotFoundError("x"), "a/b", offline=None) is None        # the caller's own wording
    assert kind_of(ValueError("something else")) is None
    text = explain(gated(), "meta-llama/Llama-2-7b-hf", repo_type="model")
    assert "gated model" in text and "https://huggingface.co/meta-llama/Llama-2-7b-hf" in text
    assert "accept its licence" in text and "hf auth login" in text and "huggingface-cli login" in text
    assert "HF_TOKEN" in text
    assert "https://huggingface.co/datasets/a/b" in explain(missing(), "a/b")


@pytest.mark.parametrize("raised, expected", [
    (DatasetNotFoundError("Dataset 'org/private-set' is a gated dataset on the Hub. You must be authenticated to "
                          "access it."), ["gated data set", "accept its licence", "HF_TOKEN"]),
    (DatasetNotFoundError("Dataset 'org/private-set' doesn't exist on the Hub or cannot be accessed."),
     ["was not found on the Hugging Face hub", "check the data set's name"]),
    (RuntimeError("Dataset scripts are no longer supported, but found private-set.py"),
     ["script repository", "parquet or json"]),
])
def test_hub_data_set_failures_are_one_line_data_errors(monkeypatch, online, raised, expected):
    import datasets

    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr(datasets, "get_dataset_split_names", fail)
    monkeypatch.setattr(datasets, "load_dataset", fail)
    src = open_source("org/private-set")
    with pytest.raises(DataError) as before_training:
        check_splits(src)                                        # what the task's validate() calls
    message = _one_line(str(before_training.value))
    assert "org/private-set" in message and all(e in message for e in expected), message
    with pytest.raises(DataError) as reading:
        next(iter(src.documents("train")))
    assert str(reading.value) == message


def test_data_files_of_a_gated_repository(monkeypatch, online):
    def fail(pattern):
        raise gated()

    monkeypatch.setattr(hub, "list_files", fail)
    with pytest.raises(DataError) as err:
        check_splits(open_source("c4"))
    assert "'allenai/c4:en' is a gated data set" in _one_line(str(err.value))


def test_a_gated_or_missing_model_says_so(monkeypatch, online):
    import transformers

    from posbench.hf.loading import HFModelError, load_config, load_llama

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(
                            wrapped(gated(), "You are trying to access a gated repo.\nMake sure to have access"))))
    with pytest.raises(HFModelError) as err:
        load_config("meta-llama/Llama-2-7b-hf")
    message = _one_line(str(err.value))
    assert "'meta-llama/Llama-2-7b-hf' is a gated model" in message and "accept its licence" in message
    assert "HF_TOKEN" in message and "pass a local directory" not in message
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(
                            wrapped(missing(), "x is not a local folder and is not a valid model identifier"))))
    with pytest.raises(HFModelError, match="was not found on the Hugging Face hub"):
        load_config("meta-llama/Llama-2-7b-hff")
    # the weights' download fails the same way (after a config that loaded)
    monkeypatch.setattr("posbench.hf.loading.load_config", lambda name: transformers.LlamaConfig())
    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(wrapped(gated(), "gated repo"))))
    with pytest.raises(HFModelError, match="is a gated model"):
        load_llama("meta-llama/Llama-2-7b-hf")


def test_a_gated_tokenizer_says_so(monkeypatch, online):
    import transformers

    from posbench.data.tokenizer import HFTokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(wrapped(gated(), "gated repo"))))
    with pytest.raises(DataError) as err:
        HFTokenizer.load("meta-llama/Llama-2-7b-hf")
    message = _one_line(str(err.value))
    assert "gated model" in message and "accept its licence" in message


def test_through_the_cli_exit_code_2_and_one_line(monkeypatch, online, tmp_path, capsys):
    import datasets
    import transformers

    def fail(*args, **kwargs):
        raise DatasetNotFoundError("Dataset 'org/gated' is a gated dataset on the Hub. You must be authenticated "
                                   "to access it.")

    monkeypatch.setattr(datasets, "get_dataset_split_names", fail)
    code = main(["run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "--data", "org/gated", "-o", str(tmp_path), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "gated data set" in err
    assert not (tmp_path / "pretrain").exists()                  # found out before anything was trained
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(wrapped(gated(), "gated repo"))))
    code = main(["extend", "--model", "meta-llama/Llama-2-7b-hf", "--method", "lora", "--length", "8192",
                 "--data", "stdlib", "--out", str(tmp_path), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is a gated model" in err and "licence" in err
