"""The ``ruler`` task: its training stream, its evaluation scored by RULER's rule end to end (oracle models that
answer all, or some, of the expected values), runs with every encoding, example-by-example pairing in
``compare --against`` and its heatmaps in ``compare --plots``."""

from __future__ import annotations

import json

import pytest
import torch

from posbench.cli import main
from posbench.data.batch import IGNORE_INDEX
from posbench.encodings import ENCODINGS
from posbench.reporters import NullReporter
from posbench.runs.config import resolve_run_config
from posbench.tasks import TASKS

from encoding_helpers import one_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def task(*sets):
    return TASKS["ruler"](resolve_run_config("ruler", "rope", "tiny", sets=list(sets)))


class Oracle:
    """Answers every prompt it knows with the first ``keep`` of its expected values (all when None)."""

    def __init__(self, task, keep: int | None = None):
        self.tok = task.tokenizer
        self.answers = {}
        for kind in task.opts["kinds"]:
            for length in task.lengths():
                for _, _, _, ex in task.examples(kind, length):
                    shown = ex.answers if keep is None else ex.answers[:keep]
                    self.answers[tuple(ex.prompt_ids)] = self.tok.encode(" " + ", ".join(shown))

    def generate(self, prompt, max_new_tokens, eos_id=None):
        rows = []
        for ids in prompt.tolist():
            answer = self.answers[tuple(ids)] + [eos_id]
            rows.append((answer + [eos_id] * max_new_tokens)[:max_new_tokens])
        return torch.tensor(rows)


def test_an_oracle_scores_100_everywhere_and_the_grid_has_every_cell():
    t = task("task.kinds=niah_single_1,niah_multivalue", "task.train_length=768", "task.trials=2")
    ev = t.evaluate(Oracle(t), torch.device("cpu"), NullReporter(), {})
    assert ev.primary == "ruler" and ev.metrics["ruler"].value == 100.0 and ev.metrics["ruler"].n == 2 * 2 * 2 * 2
    grid = ev.grids["niah_multivalue"]
    assert [a.name for a in grid.axes] == ["length", "depth"] and grid.axes[0].values == [768, 1536]
    assert grid.values == [[100.0, 100.0], [100.0, 100.0]] and grid.n == [[2, 2], [2, 2]]
    rows = list(ev.predictions)
    assert len(rows) == 16 and len({r["key"] for r in rows}) == 16
    assert rows[0]["key"].startswith("niah_single_1|768|0|") and rows[0]["correct"] is True


def test_string_match_all_counts_the_share_of_expected_values():
    """An answer naming one of the four values of a multi-value needle scores 25 (RULER's string_match_all);
    one value of one is full marks."""
    t = task("task.kinds=niah_single_1,niah_multivalue", "task.train_length=768")
    ev = t.evaluate(Oracle(t, keep=1), torch.device("cpu"), NullReporter(), {})
    assert ev.metrics["niah_single_1"].value == 100.0 and ev.metrics["niah_multivalue"].value == 25.0
    assert ev.metrics["ruler"].value == pytest.approx(62.5)


def test_the_training_stream_is_exact_deterministic_and_masks_the_prompt():
    t = task()
    stream = t.train_stream()
    batch = stream.next_batch(4)
    assert batch.tokens.shape == (4, 512) and batch.targets.shape == (4, 512)
    again = t.train_stream()
    assert torch.equal(again.next_batch(4).tokens, batch.tokens)             # a pure function of (seed, index)
    second = stream.next_batch(4)
    assert not torch.equal(second.tokens, batch.tokens)
    for row in range(4):
        kept = (batch.targets[row] != IGNORE_INDEX).nonzero().flatten()
        assert kept.numel() > 0 and int(kept[-1]) == 511                      # the answer ends at the last token
        assert batch.targets[row, kept[-1]] == t.tokenizer.eos_id
        answer = t.tokenizer.decode(batch.targets[row, kept[:-1]].tolist())
        prompt = t.tokenizer.decode(batch.tokens[row, : int(kept[0]) + 1].tolist())
        assert all(value in prompt for value in answer.replace(",", " ").split())   # the answer is in its prompt
    kinds = ["niah_single_1", "vt"]
    assert [("VAR " in t.tokenizer.decode(batch.tokens[r].tolist())) for r in range(4)] == [k == "vt" for k in
                                                                                          kinds * 2]


def test_evaluation_examples_never_meet_the_training_ones():
    t = task()
    train = {tuple(t.train_stream().next_batch(8).tokens[r].tolist()) for r in range(8)}
    evaluation = {tuple(ex.prompt_ids) for _, _, _, ex in t.examples("niah_single_1", 512)}
    assert not {p[:400] for p in train} & {p[:400] for p in evaluation}


@pytest.mark.parametrize("encoding", [  # RoPE's run in the fast tier, every other encoding's in the slow one
    pytest.param(n, marks=() if n == "rope" else pytest.mark.slow) for n in sorted(ENCODINGS) if n != "abacus"])
def test_every_encoding_runs_the_tiny_preset(encoding, tmp_path, capsys):
    assert main(["run", "-e", encoding, "-t", "ruler", "-p", "tiny", "-q", "-o", str(tmp_path)]) == 0, \
        capsys.readouterr().err
    record = json.loads(next((tmp_path / "ruler" / encoding).glob("*/result.json")).read_text())
    assert set(record["grids"]) == {"niah_single_1", "vt"}
    assert record["n_predictions"] == 2 * 2 * 2 * 1 and record["primary_metric"] == "ruler"


@pytest.mark.slow  # two runs, compare with figures
def test_compare_pairs_examples_and_draws_every_kind(tmp_path, capsys):
    for encoding in ("rope", "alibi"):
        assert main(["run", "-e", encoding, "-t", "ruler", "-p", "tiny", "-q", "-o", str(tmp_path / "runs"),
                     "--set", "task.trials=2"]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "runs"), "--against", "rope", "--plots", str(tmp_path / "figs"),
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    table = out["tables"][0]
    assert table["task"] == "ruler"
    seeds_only = [n for n in table["notes"] if "seeds only" in n]          # the effective lengths alone: no examples
    assert all({m.strip() for m in n.split(":")[-1].split(",")} <= {"eff_len", "eff_len_abs"} for n in seeds_only)
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["ruler_loss.png", "ruler_niah_single_1.png",
                                                                     "ruler_vt.png"]
