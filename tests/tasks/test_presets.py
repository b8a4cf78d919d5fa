"""Every task that trains has tiny, small, gpu and paper presets (perplexity and passkey also the CPU study's); each resolves to a valid configuration and
says how long one run of one encoding takes, on which hardware, and whether that was measured or estimated."""

from pathlib import Path

import pytest

from posbench.runs.config import resolve_run_config
from posbench.tasks import PRESET_NAMES, TASKS
from posbench.tasks.presets import presets_of

ROOT = Path(__file__).resolve().parents[2]
TRAINING_TASKS = ["arithmetic", "pretrain", "perplexity", "passkey", "scrolls", "ruler"]
#: presets beyond the four that a published study trains with (its budget, stated in its presets.toml)
STUDY_PRESETS = {"perplexity": ("study",), "passkey": ("study",)}


@pytest.mark.parametrize("task", TRAINING_TASKS)
def test_every_preset_exists_and_resolves(task):
    cls = TASKS[task]
    assert PRESET_NAMES == ("tiny", "small", "gpu", "paper")
    assert tuple(p for p in presets_of(cls) if p not in STUDY_PRESETS.get(task, ())) == PRESET_NAMES
    for preset in presets_of(cls):
        config = resolve_run_config(task, "tape", preset)
        assert config.preset == preset and "expected" not in config.to_dict()


@pytest.mark.parametrize("task", TRAINING_TASKS)
def test_every_preset_states_its_expected_time(task):
    for preset, sections in presets_of(TASKS[task]).items():
        expected = sections["expected"]
        assert set(expected) == {"seconds", "hardware", "how", "note"}, (task, preset)
        assert isinstance(expected["seconds"], (int, float)) and expected["seconds"] > 0
        assert expected["how"] in ("measured", "estimated") and expected["hardware"] and expected["note"]
        if preset == "gpu":       # the budget: one encoding in at most 10 minutes on one H100 or H200
            assert expected["seconds"] <= 600 and ("H100" in expected["hardware"] or "H200" in expected["hardware"])
        if preset in ("gpu", "paper"):             # measured only where a GPU call timed it
            assert expected["how"] == ("measured" if (task, preset) in GPU_TIMED else "estimated"), (task, preset)


#: the GPU presets a GPU call has timed, each with what came back
GPU_TIMED = {("arithmetic", "gpu"): ROOT / "results" / "reference" / "gpu-h200-2026-11-28" / "call1" / "arithmetic.tar"}


def test_a_timed_gpu_preset_has_its_measurement_beside_it():
    for (task, preset), evidence in GPU_TIMED.items():
        assert evidence.is_file(), evidence
        assert "H200" in presets_of(TASKS[task])[preset]["expected"]["hardware"]


def test_paper_arithmetic_is_one_micro_batch_and_large_evaluation_batches():
    config = resolve_run_config("arithmetic", "rope", "paper")
    assert (config.train["batch_size"], config.train["grad_accum"]) == (512, 1)
    assert config.task_options["eval_batch_size"] == 2048
