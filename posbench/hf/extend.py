"""``posbench extend``: load a Llama, apply a context-extension method, fine-tune it with posbench's engine at
the new length, save it, and write a run directory like every other run::

    <out>/extend/<label>/<run-id>/     label = llama+tape, llama+lora, llama+longlora, llama+theta
        config.json        the resolved ExtendConfig (written first; --resume reads it)
        checkpoint/        the engine's checkpoint: trainable tensors and the training state (resume)
        checkpoint/model/  the extended model (posbench.hf.saving) and its tokenizer, written after training
        result.json        training, held-out perplexity at the new length, parameter counts

The run directory itself is what ``posbench run -t perplexity|passkey --init RUN`` takes.

Configuration: built-in defaults (the TAPE paper's recipe, section 3.5: 1000 steps of 64 sequences, lr 2e-5
constant after 50 warmup steps, no weight decay, gradient checkpointing), then the preset (``paper`` or
``tiny``), then flags, then ``--set section.key=value`` with sections ``train`` (``TrainConfig`` plus
``checkpointing``), ``method`` (the method's options) and ``data`` (``text_field``, ``max_train_tokens``,
``eval_tokens``, ``eval_batch_size``).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench import engine
from posbench.config import apply_overrides, parse_assignment
from posbench.errors import ConfigError
from posbench.hf.loading import HFModelError, default_dtype, describe, load_config, load_llama, load_tokenizer
from posbench.hf.methods import Method, make_method, trainable_count
from posbench.hf.rope import llama_of, set_rope
from posbench.hf.runs import EXTEND_TASK, MODEL_SUBDIR
from posbench.results import (CHECKPOINT_DIR, CONFIG_FILE, RESULT_FILE, Metric, ResultError, atomic_write_json,
                              new_run_dir, now_iso, read_run_config, result_header, result_timings)

SECTIONS = ("train", "method", "data")
TRAIN_EXTRA = {"checkpointing": False}
# max_train_tokens 0: exactly what training reads (steps x batch_size x length + 1 tokens, no repeats)
DATA_DEFAULTS = {"text_field": "text", "max_train_tokens": 0, "eval_tokens": 0, "eval_batch_size": 1}
PAPER_TRAIN = {"steps": 1000, "batch_size": 64, "grad_accum": 64, "lr": 2e-5, "warmup_steps": 50,
               "weight_decay": 0.0, "min_lr_ratio": 1.0, "log_every": 10, "checkpoint_every": 100,
               "checkpointing": True}
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # the paper's recipe on one GPU: micro-batch 1, 64 accumulated (the authors: 8 GPUs x 1 x 8)
    "paper": {"train": PAPER_TRAIN, "data": {"eval_tokens": 262144}},
    # tests and a first try on a CPU with posbench.hf.tiny
    "tiny": {"train": {"steps": 2, "batch_size": 2, "grad_accum": 1, "lr": 1e-3, "warmup_steps": 0,
                       "weight_decay": 0.0, "min_lr_ratio": 1.0, "log_every": 1, "checkpointing": False},
             "data": {"max_train_tokens": 20000, "eval_tokens": 2048, "eval_batch_size": 4}},
}


@dataclass
class ExtendConfig:
    model: str
    method: str
    length: int
    data: str = "stdlib"
    scale: float | None = None          # None: length / the model's max_position_embeddings
    seed: int = 0
    device: str = "auto"
    preset: str = "paper"
    train: dict[str, Any] = field(default_factory=dict)
    method_options: dict[str, Any] = field(default_factory=dict)
    data_options: dict[str, Any] = field(default_factory=dict)
    task: str = EXTEND_TASK

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExtendConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as exc:
            raise ConfigError(f"not an extend run config ({exc})") from None


def resolve_extend_config(model: str, method: str, length: int, data: str, *, scale: float | None = None,
                          steps: int | None = None, seed: int = 0, device: str = "auto", preset: str = "paper",
                          sets: list[str] | tuple[str, ...] = ()) -> ExtendConfig:
    """Defaults -> preset -> flags -> ``--set``; every key type-checked (one-line errors)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset '{preset}' for extend; presets: {', '.join(PRESETS)}")
    chosen = make_method(method)                  # an unknown method is one line, before anything loads
    if length is None or length < 2:
        raise ConfigError(f"--length must be at least 2 tokens, got {length}")
    sections = {"train": {**engine.TrainConfig().to_dict(), **TRAIN_EXTRA}, "method": dict(chosen.defaults),
                "data": dict(DATA_DEFAULTS)}
    for name in ("train", "data", "method"):
        apply_overrides(sections, {f"{name}.{k}": v for k, v in PRESETS[preset].get(name, {}).items()},
                        origin=f"preset '{preset}':")
    if steps is not None:
        apply_overrides(sections, {"train.steps": steps}, origin="--steps")
    parsed = dict(parse_assignment(item) for item in sets)
    for key in parsed:
        if "." in key and key.split(".", 1)[0] not in SECTIONS:
            raise ConfigError(f"--set {key}: unknown section '{key.split('.', 1)[0]}'; extend sections: "
                              f"{', '.join(SECTIONS)}")
    apply_overrides(sections, parsed)
    make_method(method, sections["method"])       # option values checked
    _train_config(sections["train"])
    for key in ("max_train_tokens", "eval_tokens"):
        if sections["data"][key] < 0:
            raise ConfigError(f"data.{key} must be >= 0, got {sections['data'][key]}")
    if sections["data"]["eval_batch_size"] < 1:
        raise ConfigError("data.eval_batch_size must be >= 1")
    return ExtendConfig(model=str(model), method=method, length=int(length), data=data, scale=scale, seed=seed,
                        device=device, preset=preset, train=sections["train"], method_options=sections["method"],
                        data_options=sections["data"])


def _train_config(train: dict[str, Any]) -> engine.TrainConfig:
    fields = {f.name for f in dataclasses.fields(engine.TrainConfig)}
    try:
        cfg = engine.TrainConfig(**{k: v for k, v in train.items() if k in fields})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.lr <= 0:
        raise ConfigError(f"train.lr must be positive, got {cfg.lr}")
    return cfg


def label(model_config, method: str) -> str:
    return f"{model_config.model_type}+{method}"


# ---- the model ---------------------------------------------------------------------------------------------

def apply_method(model, method: Method, scale: float, length: int):
    """Interpolate RoPE (and set theta), add the method, and mark what trains; returns the model to train."""
    set_rope(model, method.rope_parameters(model.config, scale), length)
    model = method.convert(model)
    method.mark_trainable(model)
    return model


def enable_checkpointing(model) -> None:
    """Gradient checkpointing of every decoder layer (non-reentrant: TAPE's state reaches the next layer
    outside the layer's return value, which only non-reentrant checkpointing differentiates through)."""
    llama = llama_of(model)
    enable = getattr(llama, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        llama.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@dataclass
class Prepared:
    config: ExtendConfig
    method: Method
    base: Any                      # the original LlamaConfig
    scale: float
    label: str


def prepare(cfg: ExtendConfig) -> Prepared:
    """Everything that can be checked before a run directory exists (one-line errors)."""
    method = make_method(cfg.method, cfg.method_options)
    base = load_config(cfg.model)
    original = int(base.max_position_embeddings)
    if cfg.length < original:
        raise HFModelError(f"--length {cfg.length} is below the model's own context ({original} tokens, "
                           f"max_position_embeddings): extension needs a length >= {original}")
    scale = float(cfg.scale) if cfg.scale is not None else cfg.length / original
    method.rope_parameters(base, scale)          # refuses RoPE types it cannot interpolate
    method.check_length(cfg.length)
    return Prepared(cfg, method, base, scale, label(base, cfg.method))


# ---- the run -----------------------------------------------------------------------------------------------

def run_extend(cfg: ExtendConfig, out_root: Path | str = "results", *, reporter: Any = None,
               command: list[str] | None = None, run_dir: Path | None = None, resume: bool = False,
               callbacks: tuple = ()):
    """Extend, fine-tune, evaluate, save; returns ``(run_dir, result)``. ``callbacks`` go to ``engine.train``."""
    from posbench.data.lm import token_stream
    from posbench.data.sources import WHAT_TO_PASS, hub_offline, open_source
    from posbench.evaluation.perplexity import evaluate as evaluate_ppl
    from posbench.hf.adapter import HFCausalLM, HFModelConfig
    from posbench.hf.saving import save_extended
    from posbench.progress import NullReporter
    from posbench.tasks._lm_common import ChunkStream

    started = time.perf_counter()
    reporter = reporter or NullReporter()
    prep = prepare(cfg)
    method = prep.method
    data = cfg.data_options
    source = open_source(cfg.data, text_field=data["text_field"])
    if source.kind == "hub" and hub_offline():
        raise HFModelError(f"cannot load hub data set '{source.hub_name}' offline: {WHAT_TO_PASS}")
    tokenizer = load_tokenizer(cfg.model)
    if tokenizer.vocab_size > prep.base.vocab_size:
        raise HFModelError(f"the tokenizer of {cfg.model} has {tokenizer.vocab_size} tokens, more than the model's "
                           f"vocabulary ({prep.base.vocab_size})")
    train_cfg = _train_config(cfg.train)
    device = engine.pick_device(cfg.device)
    engine.setup_device(device, train_cfg.threads)
    budget = data["max_train_tokens"] or train_cfg.steps * train_cfg.batch_size * cfg.length + 1
    train_tokens = token_stream(source, "train", tokenizer, budget)
    stream = ChunkStream(cfg.seed, train_tokens.tokens, cfg.length) if train_cfg.steps > 0 else None
    seeds = engine.seed_everything(cfg.seed)
    model = load_llama(cfg.model, dtype=default_dtype(device), device="cpu")
    base_parameters = sum(p.numel() for p in model.parameters())
    model = apply_method(model, method, prep.scale, cfg.length)
    llama = llama_of(model)
    attention = method.training_attention()
    if attention is not None:
        llama.set_attn_implementation(attention)
    if cfg.train.get("checkpointing"):
        enable_checkpointing(model)
    hf_config = HFModelConfig(label=prep.label, method=method.name, method_options=dict(method.options),
                              base_model=cfg.model, scale=prep.scale, length=cfg.length, llama=describe(llama.config))
    adapter = HFCausalLM(model, hf_config, method)
    trainable = trainable_count(model)
    created = now_iso()
    if run_dir is None:                          # everything that can fail on bad input has run by now
        run_dir = new_run_dir(Path(out_root), EXTEND_TASK, prep.label)
    if not (run_dir / CONFIG_FILE).exists():
        atomic_write_json(run_dir / CONFIG_FILE, {"config": cfg.to_dict(), "created": created,
                                                  "command": command or sys.argv})

    precision = engine.resolve_precision(train_cfg.precision, device)
    train_result = engine.train(adapter, stream, train_cfg, device=device, checkpoint_dir=run_dir / CHECKPOINT_DIR,
                                resume=resume, callbacks=callbacks, reporter=reporter, seed=cfg.seed,
                                description=f"{prep.label} extend")
    if attention is not None:
        llama.set_attn_implementation("sdpa")     # saved and evaluated with full attention

    eval_start = time.perf_counter()
    metrics: dict[str, Metric] = {}
    evaluation: dict[str, Any] = {}
    if train_result.final_loss is not None:
        metrics["train_loss"] = Metric(train_result.final_loss, None, None, higher_is_better=False)
    validation = None
    if data["eval_tokens"] > 0:
        validation = token_stream(source, "validation", tokenizer, data["eval_tokens"])
        adapter.eval()
        bar = reporter.task("eval", total=1, unit="length")
        with torch.no_grad(), engine.autocast(device, precision):
            res = evaluate_ppl(adapter, validation.tokens, cfg.length, "chunks", batch_size=data["eval_batch_size"],
                               device=device)
        bar.update(1, ppl=res.perplexity)
        bar.close()
        if res.tokens_scored:
            metrics["val_ppl"] = Metric(res.perplexity, None, res.tokens_scored, higher_is_better=False)
            metrics["val_loss"] = Metric(res.mean_nll, None, res.tokens_scored, higher_is_better=False)
        evaluation = {"protocol": "chunks", **res.to_dict()}
    eval_s = time.perf_counter() - eval_start

    model_dir = run_dir / MODEL_SUBDIR
    if resume and model_dir.exists():             # a kill between saving and result.json: save again
        shutil.rmtree(model_dir)
    meta = {"label": prep.label, "base_model": cfg.model, "scale": prep.scale, "length": cfg.length,
            "original_max_position_embeddings": int(prep.base.max_position_embeddings),
            "original_rope_parameters": dict(prep.base.rope_parameters), "run_id": run_dir.name}
    save_extended(adapter.hf, method, model_dir, meta, tokenizer)

    llama_after = llama_of(adapter.hf).config
    result = {
        **result_header(run_dir, EXTEND_TASK, prep.label, cfg.preset, created=created, command=command,
                        device=device, precision=precision, resumed=resume),
        "label": prep.label,
        "seeds": {**seeds, "data": cfg.seed},
        "config": run_config_view(cfg, prep, hf_config),
        "model": {"parameters": adapter.num_parameters(), "base_parameters": base_parameters,
                  "added_parameters": adapter.num_parameters() - base_parameters,
                  "added_formula": method.added_formula(llama_after),
                  "trainable_parameters": trainable, "trainable_formula": method.trainable_formula(llama_after),
                  "checkpoint": MODEL_SUBDIR, "checkpoint_sha256": _digest(model_dir),
                  "dtype": str(default_dtype(device)).replace("torch.", ""),
                  "gradient_checkpointing": bool(cfg.train.get("checkpointing"))},
        "init": None,
        "base_model": {"name": cfg.model, **describe(prep.base)},
        "data": {"source": source.spec, "source_info": source.describe(),
                 "tokenizer": {**tokenizer.spec(), "dir": MODEL_SUBDIR}, "train": train_tokens.describe(),
                 **({"validation": validation.describe()} if validation is not None else {}),
                 "hash": train_tokens.sha256,
                 "documents": "concatenated, each followed by EOS, cut into non-overlapping chunks of --length"},
        "training": train_result.to_dict(),
        "timings": result_timings(train_result.train_s, eval_s, started, train_result.tokens_per_s),
        "metrics": {name: metric.to_dict() for name, metric in metrics.items()},
        "primary_metric": "val_ppl" if "val_ppl" in metrics else ("train_loss" if metrics else None),
        "grids": {},
        "evaluation": evaluation,
        "predictions": None, "n_predictions": 0,
    }
    atomic_write_json(run_dir / RESULT_FILE, result)
    return run_dir, result


def run_config_view(cfg: ExtendConfig, prep: Prepared, hf_config) -> dict[str, Any]:
    """``result["config"]`` in the shape of every run's (``RunConfig``: model, encoding_options, train and
    task_options sections), so that ``compare`` reads an extend run like any other (the method is the
    encoding label; its options are the encoding options); ``extend`` keeps the configuration as ``--resume``
    reads it."""
    return {"task": EXTEND_TASK, "encoding": prep.label, "preset": cfg.preset, "seed": cfg.seed, "device": cfg.device,
            "init": None, "model": describe(prep.base), "encoding_options": dict(prep.method.options),
            "train": dict(cfg.train),
            "task_options": {"model": cfg.model, "length": cfg.length, "scale": prep.scale, "data": cfg.data,
                             **cfg.data_options},
            "model_config": hf_config.to_dict(), "extend": cfg.to_dict()}


def _digest(directory: Path) -> str:
    from posbench.hf.runs import weights_digest

    return weights_digest(directory)


def resume_extend(run_dir: Path | str, *, device: str | None = None, reporter: Any = None, callbacks: tuple = ()):
    """Continue a killed extend run in place from its last checkpoint."""
    run_dir = Path(run_dir)
    stored = read_run_config(run_dir)
    if (run_dir / RESULT_FILE).exists():
        raise ResultError(f"{run_dir} has already finished (result.json exists); start a new run instead")
    config = stored.get("config")
    if not isinstance(config, dict) or config.get("task") != EXTEND_TASK:
        raise ResultError(f"{run_dir} is not an extend run (resume other runs with 'posbench run --resume')")
    cfg = ExtendConfig.from_dict(config)
    if device is not None:
        cfg.device = device
    has_checkpoint = engine.checkpoint_path(run_dir / CHECKPOINT_DIR) is not None
    return run_extend(cfg, run_dir.parent.parent.parent, reporter=reporter, run_dir=run_dir, resume=has_checkpoint,
                      callbacks=callbacks)
