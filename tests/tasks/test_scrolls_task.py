"""The scrolls task: prompts and truncation, answer-only loss, generation limits, and a tiny end-to-end run."""

from pathlib import Path

import pytest
import torch

from posbench.errors import ConfigError
from posbench.runs.config import resolve_run_config
from posbench.tasks.scrolls import data as sd
from posbench.data.batch import IGNORE_INDEX
from posbench.tasks.scrolls.task import ExampleStream, Scrolls

FIXTURES = Path(__file__).parents[1] / "fixtures" / "scrolls"


def _task(*sets, steps=None, datasets="qasper"):
    first = [f"train.steps={steps}"] if steps is not None else []
    cfg = resolve_run_config("scrolls", "rope", "tiny", sets=[*first, f"task.data={FIXTURES}",
                                                              f"task.datasets={datasets}", *sets])
    task = Scrolls(cfg)
    task.validate()
    return task


def test_prompt_truncates_only_the_document_from_the_chosen_side():
    ex = sd.Example(id="x", pid="x0", input="", outputs=["a"], question="Who?", text="0123456789" * 10)
    end = _task("task.max_input_tokens=40")
    ids, truncated = end.encode_prompt("qasper", ex)
    suffix = "\n\nQuestion: Who?\nAnswer:"
    assert truncated and len(ids) == 40
    assert end.tokenizer.decode(ids) == ex.text[:40 - len(suffix)] + suffix
    start = _task("task.max_input_tokens=40", "task.truncation_side=start")
    ids, _ = start.encode_prompt("qasper", ex)
    assert start.tokenizer.decode(ids) == ex.text[-(40 - len(suffix)):] + suffix
    short = sd.Example(id="y", pid="y0", input="", outputs=["a"], question="Q", text="short")
    ids, truncated = end.encode_prompt("qasper", short)
    assert not truncated and end.tokenizer.decode(ids) == "short\n\nQuestion: Q\nAnswer:"


def test_loss_only_on_answer_tokens_and_eos():
    rows = [([10, 11, 12], [20, 21, 2]), ([13, 14], [22, 2])]
    batch = ExampleStream(0, rows, pad_id=0).next_batch(4)
    for tokens, targets in zip(batch.tokens.tolist(), batch.targets.tolist()):
        kept = [(t, y) for t, y in zip(tokens, targets) if y != IGNORE_INDEX]
        if tokens[:3] == [10, 11, 12]:
            assert kept == [(12, 20), (20, 21), (21, 2)]     # predicts each answer token and EOS, nothing else
        else:
            assert kept == [(14, 22), (22, 2)]


def test_generation_limits_steps_and_validation():
    task = _task()
    assert task.gen_limits["qasper"] == 12                   # tiny preset: max_new_tokens=12 for all
    task = _task("task.max_new_tokens=qasper=5,gov_report=7")
    assert task.gen_limits["qasper"] == 5 and task.gen_limits["contract_nli"] == 8 * 4   # byte: x4
    task = _task(steps=9)                                    # --steps: the fine-tuning of each data set
    assert task.config.train["steps"] == 9 and [p.train.steps for p in task.phases()] == [9]
    with pytest.raises(ConfigError, match="truncation_side"):
        _task("task.truncation_side=middle")
    from posbench.data import DataError
    with pytest.raises(DataError, match="unknown SCROLLS data set"):
        _task(datasets="qasper,squad")


def test_tiny_end_to_end_run(tmp_path):
    from posbench.runs import runner

    cfg = resolve_run_config("scrolls", "alibi", "tiny", sets=[f"task.data={FIXTURES}",
                                                               "task.datasets=gov_report,qasper,contract_nli",
                                                               "task.max_eval_examples=3"])
    outcome = runner.execute(cfg, tmp_path)
    r = outcome.record.to_dict()
    assert list(r["metrics"]) == ["qasper_f1", "contract_nli_em", "gov_report_rgm", "scrolls_score"]
    assert r["primary_metric"] == "scrolls_score"
    assert r["evaluation"]["table_columns"] == list(r["metrics"])
    per = r["evaluation"]["per_dataset"]
    assert per["qasper"]["n_eval"] == 3 and per["qasper"]["finetune"]["steps"] == 4
    assert per["gov_report"]["official"]["display_keys"] == ["rouge/rouge1", "rouge/rouge2", "rouge/rougeL"]
    assert r["data"]["max_input_tokens"] == 128 and r["data"]["truncation_side"] == "end"
    assert r["data"]["tokenizer"]["kind"] == "byte"
    assert r["config"]["train"]["steps"] == 4 and r["training"]["steps"] == 3 * 4
    assert sorted(p.name for p in (outcome.run_dir / "phases").iterdir()) == [
        "contract_nli.json", "gov_report.json", "qasper.json"]
    assert not any((outcome.run_dir / "checkpoint").glob("*/model.safetensors"))   # kept: the outcomes only
    sub = outcome.run_dir / "scrolls" / "qasper.json"
    assert sub.is_file()
    import json
    assert set(json.loads(sub.read_text())) == {"qa-v1", "qa-v2", "qa-v3"}
    assert r["n_predictions"] == 3 + 2 + 2
    assert torch.isfinite(torch.tensor([m["value"] for m in r["metrics"].values()])).all()


@pytest.mark.slow  # a run, killed, resumed
def test_a_killed_run_resumes_its_fine_tuning_and_skips_finished_data_sets(tmp_path):
    """Each data set's fine-tuning is a checkpointed phase: killed in the middle of the second one, the run
    resumes there (the first data set's saved outcome is kept, not recomputed) and ends exactly as an
    uninterrupted run (same metrics, same predictions)."""
    from posbench.runs import runner
    from posbench.train import StopTraining

    cfg = resolve_run_config("scrolls", "rope", "tiny", sets=[f"task.data={FIXTURES}",
                                                              "task.datasets=qasper,contract_nli",
                                                              "task.max_eval_examples=2", "train.checkpoint_every=1"])
    whole = runner.execute(cfg, tmp_path / "a")
    calls = []

    def kill(step, model, loss):
        calls.append(step)
        if len(calls) == 6:                      # qasper's 4 steps, then step 2 of contract_nli
            raise StopTraining

    with pytest.raises(StopTraining):
        runner.execute(cfg, tmp_path / "b", callbacks=(kill,))
    killed = next((tmp_path / "b" / "scrolls" / "rope").iterdir())
    assert (killed / "phases" / "qasper.json").is_file() and not (killed / "phases" / "contract_nli.json").exists()
    assert (killed / "checkpoint" / "contract_nli" / "model.safetensors").is_file()
    first = (killed / "phases" / "qasper.json").stat().st_mtime_ns
    resumed = runner.resume(killed)
    assert (killed / "phases" / "qasper.json").stat().st_mtime_ns == first          # not recomputed
    per = resumed.record.evaluation["per_dataset"]
    assert per["contract_nli"]["finetune"]["resumed_from"] == [2] and per["contract_nli"]["finetune"]["steps"] == 4
    uninterrupted = whole.record.evaluation["per_dataset"]["contract_nli"]["finetune"]
    assert per["contract_nli"]["finetune"]["loss_history"] == uninterrupted["loss_history"]      # bitwise
    assert {k: m.value for k, m in resumed.record.metrics.items()} == {k: m.value for k, m in whole.record.metrics.items()}
    import json
    assert [json.loads(line)["prediction"] for line in (killed / "predictions.jsonl").read_text().splitlines()] == \
        [json.loads(line)["prediction"] for line in (whole.run_dir / "predictions.jsonl").read_text().splitlines()]
