"""``extend``: extend a pretrained Llama's context window with a method (tape, lora, longlora, theta, ...),
fine-tune it at the new length with posbench's engine, measure held-out perplexity there, and save the extended
model with the run (``posbench extend`` is this task with friendlier flags)::

    posbench extend --model ./llama-2-7b --method tape --length 8192 --data DIR
    posbench run -t extend --init ./llama-2-7b --encoding tape --set task.length=8192 --data DIR   # the same

The pretrained model is the run's ``--init`` (a Hugging Face directory or hub name); the method takes the place
of the encoding (its options are the ``encoding`` section, ``--set method.r=16`` works too). The run directory
``<out>/extend/<model>+<method>/<run-id>/`` holds the engine's checkpoint (only what trains) and, once finished,
the extended model in ``checkpoint/model`` (``posbench.hf.saving``), which ``posbench run -t perplexity|passkey
--init RUN`` evaluates.

Training data: the corpus's documents, each followed by EOS, cut into chunks of ``--length`` tokens, read up to
exactly what training uses (steps x batch x length + 1 tokens, no repeats) unless ``task.max_train_tokens``
says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posbench.data.lm import token_stream
from posbench.errors import ConfigError
from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Evaluation, Metric
from posbench.evaluation.perplexity import evaluate as evaluate_ppl
from posbench.hf.loading import HFModelError, default_dtype, describe, load_config, load_tokenizer
from posbench.hf.methods import make_method
from posbench.hf.rope import llama_of
from posbench.hf.saving import save_extended, weights_digest
from posbench.options import Option, at_least
from posbench.tasks.corpus_task import CorpusTask
from posbench.tasks.extend.source import EXTENDED_LLAMA

MODEL_SUBDIR = "checkpoint/model"


register_metric("extend", "train_loss", better="lower",
                description="the training loss at the last step of the extension's fine-tuning")
register_metric("extend", "val_ppl", better="lower",
                description="held-out perplexity at the extended length (non-overlapping chunks)")
register_metric("extend", "val_loss", better="lower",
                description="held-out mean negative log-likelihood per token (nats) at the extended length")


class Extend(CorpusTask):
    name = "extend"
    description = "extend a pretrained Llama's context (tape, lora, longlora, theta, ...) and fine-tune it"
    OPTIONS = {
        "length": Option(0, "the new context length in tokens (at least the model's own)", at_least(2)),
        "scale": Option(0.0, "linear position interpolation factor (0: length / the model's context)", at_least(0)),
        **{key: CorpusTask.OPTIONS[key] for key in ("data", "text_field")},
        "max_train_tokens": Option(0, "training tokens read (0: exactly what training uses, steps x batch x length)",
                                   at_least(0)),
        "eval_tokens": Option(0, "held-out tokens evaluated at the new length (0: the whole held-out split)",
                              at_least(0)),
        "eval_batch_size": Option(1, "windows per forward pass in evaluation", at_least(1), changes_results=False),
        "probe_tokens": CorpusTask.OPTIONS["probe_tokens"],
    }
    default_preset = "small"

    model_source = EXTENDED_LLAMA                          # the pretrained Llama with its method (source.py)

    # ---- configuration ---------------------------------------------------------------------------------------
    follows = {"model.max_seq_len": "task.length"}

    @classmethod
    def adjust(cls, sections, source) -> None:
        """The training length is the new context length."""
        if not sections["task"]["length"]:                 # required (its range is in ``limits``)
            raise ConfigError("extend needs --length (the new context length in tokens)")
        sections["model"]["max_seq_len"] = int(sections["task"]["length"])

    @classmethod
    def label_for(cls, encoding, source, options) -> str:
        """``<base>+<method>``: the base is the model's label (a Hugging Face model's type, ``llama``; a posbench
        export's encoding, ``rope``: an extension of posbench's RoPE model is ``rope+tape``, never mistaken for an
        extension of a real Llama, ``llama+tape``)."""
        return f"{source.label}+{encoding}"

    # ---- the model -------------------------------------------------------------------------------------------
    @property
    def method(self):
        if getattr(self, "_method", None) is None:
            self._method = make_method(self.config.encoding, self.config.encoding_options)
        return self._method

    @property
    def base(self):
        """The pretrained model's ``LlamaConfig``."""
        if getattr(self, "_base", None) is None:
            self._base = load_config(self.source.model_dir)
        return self._base

    @property
    def scale(self) -> float:
        return float(self.opts["scale"]) or self.opts["length"] / int(self.base.max_position_embeddings)

    def _resolve_tokenizer(self):
        """The pretrained model's own (Hugging Face) tokenizer, saved with the extended model."""
        return load_tokenizer(self.source.model_dir)

    def validate(self) -> None:
        original = int(self.base.max_position_embeddings)
        if self.opts["length"] < original:
            raise HFModelError(f"--length {self.opts['length']} is below the model's own context ({original} tokens, "
                               f"max_position_embeddings): extension needs a length >= {original}")
        self.method.rope_parameters(self.base, self.scale)       # refuses RoPE types it cannot interpolate
        self.method.check_length(self.opts["length"])
        self.method.check_steps(self.config.training.steps)      # a training-free method (ntk) takes none
        super().validate()
        if self.tokenizer.vocab_size > self.base.vocab_size:
            raise HFModelError(f"the tokenizer of {self.source.given} has {self.tokenizer.vocab_size} tokens, more "
                               f"than the model's vocabulary ({self.base.vocab_size})")

    def train_tokens(self):
        if self._train is None and not self.opts["max_train_tokens"]:
            train = self.config.training
            budget = train.steps * train.batch_size * self.opts["length"] + 1
            self._train = token_stream(self.corpus, "train", self.tokenizer, budget)
        return super().train_tokens()

    # ---- evaluation ------------------------------------------------------------------------------------------
    def evaluate(self, model, device, reporter: Any, phases: dict) -> Evaluation:
        if self.method.training_attention() is not None:
            model.use_attention("sdpa")                   # evaluated (and saved) with full attention
        metrics: dict[str, Metric] = {}
        final_loss = (phases.get("train") or {}).get("training", {}).get("final_loss")
        if final_loss is not None:
            metrics["train_loss"] = Metric(final_loss, None, None)
        bar = reporter.task("eval", total=1, unit="length")
        res = evaluate_ppl(model, self.eval_tokens().tokens, self.opts["length"], "chunks",
                           batch_size=self.opts["eval_batch_size"], device=device)
        bar.update(1, ppl=res.perplexity)
        bar.close()
        if res.tokens_scored:
            metrics["val_ppl"] = Metric(res.perplexity, None, res.tokens_scored)
            metrics["val_loss"] = Metric(res.mean_nll, None, res.tokens_scored)
        primary = "val_ppl" if "val_ppl" in metrics else ("train_loss" if metrics else None)
        return Evaluation(metrics=metrics, primary=primary, info={"protocol": "chunks", **res.to_dict()})

    def finish(self, model, run_dir: Path) -> dict[str, Any]:
        """Save the extended model (``checkpoint/model``); its sizes and formulas for the record."""
        directory = Path(run_dir) / MODEL_SUBDIR
        meta = {"label": self.config.label, "base_model": self.source.given, "scale": self.scale,
                "length": self.opts["length"], "original_max_position_embeddings": int(self.base.max_position_embeddings),
                "original_rope_parameters": dict(self.base.rope_parameters), "run_id": Path(run_dir).name}
        save_extended(model.hf, self.method, directory, meta, self.tokenizer, replace=True)
        after = llama_of(model.hf).config
        return {"scale": self.scale, "base_parameters": self.base_parameters,
                "added_parameters": model.num_parameters() - self.base_parameters,
                "added_formula": self.method.added_formula(after),
                "trainable_parameters": model.trainable_parameters(),
                "trainable_formula": self.method.trainable_formula(after),
                "checkpoint": MODEL_SUBDIR, "checkpoint_sha256": weights_digest(directory),
                "dtype": str(default_dtype(model.device)).replace("torch.", ""),
                "gradient_checkpointing": bool(self.config.train.get("checkpointing")),
                "base_model": {"name": self.source.given, **describe(self.base)}}
