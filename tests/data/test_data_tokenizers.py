"""Tokenizers: bytes round-trip any UTF-8 text; a BPE trains, saves and reloads; HF ones load from paths."""

import random

import pytest

from posbench.data import DataError
from posbench.data.tokenizer import (BPETokenizer, ByteTokenizer, HFTokenizer, build_tokenizer, parse_bpe_spec,
                                     tokenizer_from_spec)

SAMPLES = ["", "hello world", "naïve café — ünïcödé", "日本語のテキスト", "emoji 🧪🚀 and \U0010FFFF",
           "tabs\tand\nnewlines\r\n", "\x00\x01 control", "def f(x):\n    return x ** 2  # comment\n"]
CORPUS = ["def add(a, b):\n    return a + b\n", "class Foo:\n    pass\n", "import os\nprint(os.getcwd())\n",
          "for i in range(10):\n    print(i * i)\n"] * 30


def _random_texts(n=200, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(0, 40)):
            cp = rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xD7FF),
                             rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])
            chars.append(chr(cp))
        out.append("".join(chars))
    return out


def test_byte_tokenizer_round_trips_any_utf8():
    tok = ByteTokenizer()
    for text in SAMPLES + _random_texts():
        ids = tok.encode(text)
        assert all(0 <= i < 256 for i in ids)
        assert len(ids) == len(text.encode("utf-8"))
        assert tok.decode(ids) == text
        assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == text
    assert tok.vocab_size == 259 and {tok.bos_id, tok.eos_id, tok.pad_id} == {256, 257, 258}
    assert build_tokenizer(None).spec() == tok.spec()


def test_bpe_trains_saves_reloads(tmp_path):
    tok = BPETokenizer.train(iter(CORPUS), vocab_size=300, trained_on={"source": "unit"})
    assert tok.vocab_size <= 300 and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = tok.encode(CORPUS[0])
    assert len(ids) < len(CORPUS[0].encode())          # merges happened
    for text in SAMPLES + _random_texts(50):           # byte-level: lossless on anything
        assert tok.decode(tok.encode(text)) == text
    tok.save(tmp_path)
    again = BPETokenizer.load(tmp_path)
    assert again.encode(CORPUS[1]) == tok.encode(CORPUS[1])
    assert again.spec() == tok.spec() and again.spec()["trained_on"] == {"source": "unit"}
    assert tokenizer_from_spec(tok.spec(), tmp_path).encode("print(x)") == tok.encode("print(x)")
    assert tok.encode_batch(CORPUS[:2]) == [tok.encode(CORPUS[0]), tok.encode(CORPUS[1])]


def test_bpe_spec_parsing_and_training_through_build(tmp_path):
    assert parse_bpe_spec("bpe") == 4096 and parse_bpe_spec("bpe:512") == 512 and parse_bpe_spec("gpt2") is None
    with pytest.raises(DataError, match="bpe:VOCAB_SIZE"):
        parse_bpe_spec("bpe:lots")
    tok = build_tokenizer("bpe:280", train_texts=lambda: iter(CORPUS))
    assert tok.kind == "bpe"
    with pytest.raises(DataError, match="needs a training corpus"):
        build_tokenizer("bpe")


def test_hf_tokenizer_from_local_file_and_dir(tmp_path):
    bpe = BPETokenizer.train(iter(CORPUS), vocab_size=300)
    bpe.save(tmp_path)
    hf = build_tokenizer(str(tmp_path / "tokenizer.json"))
    assert isinstance(hf, HFTokenizer)
    assert hf.encode(CORPUS[2]) == bpe.encode(CORPUS[2])
    assert hf.decode(hf.encode("x = 1\n")) == "x = 1\n"
    assert hf.eos_id == bpe.eos_id
    hf.save(tmp_path / "run")
    again = tokenizer_from_spec(hf.spec(), tmp_path / "run")
    assert again.encode(CORPUS[3]) == hf.encode(CORPUS[3])


def test_hf_tokenizer_by_name_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as err:
        build_tokenizer("definitely-not-cached/tokenizer-xyz")
    msg = str(err.value)
    assert "\n" not in msg and "--tokenizer byte" in msg and "PATH" in msg
