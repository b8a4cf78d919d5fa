"""A finished run's trained model and its held-out text, from Python in one call::

    from posbench.results import load_run
    run = load_run("results/perplexity/rope/20261207-050620-782488")
    run.model                  # posbench's Transformer with the run's final weights, in eval mode
    run.tokens                 # the held-out token ids its evaluation read (1-D int64 tensor)
    run.record                 # its result.json (posbench.runs.record.RunRecord)
    run.train_length           # the training length in tokens
    logits = run.model(run.tokens[None, :1024])

The model is built from the record's model configuration and loaded from ``checkpoint/model.safetensors`` (the
final weights); the held-out text is the one the run's task evaluated (its corpus, tokenizer and
``task.eval_tokens``), rebuilt from the run's own configuration, with its tokenizer from the run directory.
Runs of the language-model tasks (pretrain, perplexity) have held-out text; for a run of another task
``tokens`` is None. Everything wrong with the directory is one line (``ResultError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posbench.runs.config import RunConfig, task_class, with_source
from posbench.runs.record import RESULT_FILE, ResultError, RunRecord
from posbench.runs.store import CHECKPOINT_DIR, load_record

WEIGHTS = "model.safetensors"


@dataclass
class LoadedRun:
    record: RunRecord
    model: Any
    task: Any
    tokens: torch.Tensor | None
    train_length: int
    start_token: int | None = None          # the token every evaluation window began with (task.start_token)

    @property
    def path(self) -> Path:
        return Path(self.record.path)


def load_run(run_dir: Path | str, device: str | torch.device = "cpu") -> LoadedRun:
    """The run in ``run_dir`` (a finished posbench run with its checkpoint), as described in the module docstring."""
    from posbench.model import ModelConfig, Transformer  # torch: only for what builds or names a class
    from posbench.train.checkpoint import CheckpointError, load_weights  # torch: only for what builds or names a class

    run_dir = Path(run_dir)
    if not (run_dir / RESULT_FILE).is_file():
        raise ResultError(f"{run_dir} is not a finished run (no {RESULT_FILE})")
    record = load_record(run_dir / RESULT_FILE, with_settings=True)
    weights = run_dir / CHECKPOINT_DIR / WEIGHTS
    if not weights.is_file():
        raise ResultError(f"{run_dir} kept no trained weights ({CHECKPOINT_DIR}/{WEIGHTS}); only a run that trained "
                          f"posbench's own model has them")
    if not record.model_config or "encoding" not in record.model_config:
        raise ResultError(f"{run_dir}: its record holds no posbench model configuration (an extend run's model is "
                          f"a Hugging Face model: load it with transformers)")
    try:
        model = Transformer(ModelConfig(**{k: v for k, v in record.model_config.items()
                                           if k in ModelConfig.__dataclass_fields__}))
        load_weights(model, weights)
    except (CheckpointError, TypeError, ValueError, RuntimeError, KeyError) as exc:
        raise ResultError(f"{run_dir}: its checkpoint does not build its recorded model ({exc})") from None
    model.to(device).eval()
    task = own_task(record, run_dir)
    tokens = torch.as_tensor(task.eval_tokens().tokens, dtype=torch.long) if hasattr(task, "eval_tokens") else None
    train_length = int(record.model_config.get("max_seq_len") or 0)
    return LoadedRun(record, model, task, tokens, train_length, getattr(task, "start_token", None))


def own_task(record: RunRecord, run_dir: Path) -> Any:
    """The run's task built from its own recorded configuration (its data, its tokenizer from ``run_dir``)."""
    config = with_source(RunConfig.from_dict(record.config.to_dict(), earlier_values=True))
    task = task_class(config.task)(config)
    task.run_dir = run_dir                  # a trained BPE tokenizer is read from here ...
    task._tokenizer_saved = True            # ... and nothing is written into the finished run
    return task
