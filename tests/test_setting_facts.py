"""A setting's facts live on its declaration (issue 50, item 5): whether it changes what a run computes
(``Option(changes_results=False)``) and since when it exists with the value runs had before (``added``);
compare's grouping reads them from there (``posbench.setting_facts``), for a plugin's declaration too."""

from __future__ import annotations

from pathlib import Path

import pytest

from posbench import report
from posbench.encodings import ENCODINGS
from posbench.encodings.alibi import ALiBi
from posbench.errors import ConfigError
from posbench.options import Added, Option, at_least
from posbench.setting_facts import SettingFacts, declared_facts, facts_of_owners
from tests.report.test_compare import make_run

#: the sets report/grouping.py wrote out by hand before they moved onto the declarations (and task.probe_tokens,
#: the length probe's sample, since issue 56)
IGNORED = ("train.threads", "train.compile", "train.log_every", "train.checkpoint_every", "train.probe_every",
           "model.attention", "task.eval_batch_size", "task.cells_to", "task.probe_tokens")
ADDED = {"train.checkpointing": False,
         "model.norm": "rms", "model.norm_position": "pre", "model.mlp": "swiglu", "model.embedding_norm": False,
         "model.head_mlp": False, "model.recurrences": 1, "model.eval_recurrences": 0, "model.input_injection": False,
         "model.state_std": 0.0, "model.init_scheme": "normal",
         "encoding.table_init": "x-transformers", "encoding.attention_bias": "none", "encoding.fire_init_l": 0.0,
         "task.start_token": False,
         "train.probe_every": 0, "task.probe_tokens": 4096}     # (changes_results=False: for --resume's fill)


def test_the_declarations_give_the_sets_grouping_had_by_hand():
    facts = declared_facts()
    assert facts.ignored == frozenset(IGNORED)
    assert {k: (type(v.before), v.before) for k, v in facts.added.items()} == \
        {k: (type(v), v) for k, v in ADDED.items()}
    assert {v.schema for v in facts.added.values()} == {2}


def test_a_setting_counts_unless_ignored_or_added_at_its_old_value():
    facts = SettingFacts(frozenset({"train.threads"}), {"model.norm": Added(2, "rms")})
    assert not facts.counts("train.threads", 4, 2)
    assert facts.counts("train.lr", 1e-3, 2)
    assert not facts.counts("model.norm", "rms", 2)          # what every earlier run had: as if unrecorded
    assert facts.counts("model.norm", "layer", 2)
    assert facts.counts("model.norm", "rms", 1)             # a schema-1 record that holds it keeps it


def test_two_declarations_of_one_setting_added_differently_are_refused():
    class A:
        OPTIONS = {"x": Option(1, "x", at_least(0), added=Added(2, 1))}

    class B:
        OPTIONS = {"x": Option(2, "x", at_least(0), added=Added(2, 2))}

    assert facts_of_owners([("task", A), ("task", A)]).added == {"task.x": Added(2, 1)}
    with pytest.raises(ConfigError, match="task.x is declared added"):
        facts_of_owners([("task", A), ("task", B)])


@pytest.fixture
def quiet_encoding():
    """A plugin's encoding with an option that changes no result (``chunk``), one that does (``width``) and one
    added later (``gain``, 1.0 before)."""
    class Quiet(ALiBi):
        name = "test-quiet"
        OPTIONS = {**ALiBi.OPTIONS,
                   "chunk": Option(4, "keys per block of the bias", at_least(1), changes_results=False),
                   "width": Option(1, "a width", at_least(1)),
                   "gain": Option(1.0, "a gain", at_least(0), added=Added(2, 1.0))}
    yield Quiet
    ENCODINGS.remove("test-quiet")


def test_a_new_declaration_that_changes_no_result_is_left_out_of_grouping(tmp_path, quiet_encoding):
    assert "encoding.chunk" in declared_facts().ignored
    make_run(tmp_path, "arithmetic", "test-quiet", 0, {"accuracy": 40.0}, encoding_options={"chunk": 1, "width": 1})
    make_run(tmp_path, "arithmetic", "test-quiet", 1, {"accuracy": 44.0}, encoding_options={"chunk": 8, "width": 1})
    (table,) = report.collect(tmp_path).tables
    assert [(r.label, r.seed) for r in table.rows] == [("test-quiet", [0, 1])]
    make_run(tmp_path, "arithmetic", "test-quiet", 2, {"accuracy": 50.0}, encoding_options={"chunk": 1, "width": 2})
    (table,) = report.collect(tmp_path).tables                # width changes results: a row of its own
    assert sorted(r.label for r in table.rows) == ["test-quiet [encoding.width=1]", "test-quiet [encoding.width=2]"]


def test_a_new_declaration_added_later_pools_old_and_new_runs(tmp_path, quiet_encoding):
    make_run(tmp_path, "arithmetic", "test-quiet", 0, {"accuracy": 40.0})                      # before gain existed
    make_run(tmp_path, "arithmetic", "test-quiet", 1, {"accuracy": 44.0}, encoding_options={"gain": 1.0},
             extra={"schema_version": 2})
    (table,) = report.collect(tmp_path).tables
    assert [(r.label, r.seed) for r in table.rows] == [("test-quiet", [0, 1])]
    make_run(tmp_path, "arithmetic", "test-quiet", 2, {"accuracy": 50.0}, encoding_options={"gain": 2.0},
             extra={"schema_version": 2})
    (table,) = report.collect(tmp_path).tables
    # the pooled row (a record without gain, one at the value those runs had) says that value, not "-"
    assert sorted(r.label for r in table.rows) == ["test-quiet [encoding.gain=1]", "test-quiet [encoding.gain=2]"]


def test_an_earlier_value_is_the_rows_own_encodings(tmp_path):
    """Abacus declares ``fire_init_l`` added (earlier value 0); DAPE declares the same name without that mark (its
    default 64, never 0). A DAPE record without the key is labelled "-", not Abacus's 0."""
    assert declared_facts().added["encoding.fire_init_l"].before == 0.0
    make_run(tmp_path, "arithmetic", "dape", 0, {"accuracy": 40.0}, encoding_options={"base": "alibi"})
    make_run(tmp_path, "arithmetic", "dape", 1, {"accuracy": 44.0}, encoding_options={"base": "alibi",
                                                                                      "fire_init_l": 32.0})
    (table,) = report.collect(tmp_path).tables
    assert sorted(r.label for r in table.rows) == ["dape [encoding.fire_init_l=-]", "dape [encoding.fire_init_l=32]"]


def test_the_comparing_page_names_every_setting_that_changes_no_result():
    page = (Path(__file__).resolve().parents[1] / "docs" / "comparing.md").read_text(encoding="utf-8")
    missing = [name for name in sorted(declared_facts().ignored) if f"`{name}`" not in page]
    assert not missing, f"docs/comparing.md does not list {missing} among the settings compare pools over"
