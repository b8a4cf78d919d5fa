"""``posbench export`` of an ``extend`` run: the extended model as a directory that plain transformers loads with
its method intact, and that lm-evaluation-harness evaluates at the length it was extended to.

* ``lora``, ``longlora``, ``theta``, ``yarn``: the adapter folded into the weights (W + alpha/r B A) and saved
  as a plain ``LlamaForCausalLM`` whose ``rope_parameters`` carry the method's rotary change (linear
  interpolation, theta, transformers' ``yarn``): ``AutoModelForCausalLM`` loads it with nothing else;
* ``ntk``: the Llama with transformers' ``dynamic`` rope parameters (its ``max_position_embeddings`` stays the
  original context, which dynamic scaling starts from; ``n_positions``, the first field lm-eval reads, is
  the extended length);
* ``tape``: the TAPE-extended Llama as its own model type (``posbench.hf.tape_model``):
  ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` with posbench installed.

Each directory also holds the tokenizer (``model_max_length`` = the extended length), ``generation_config.json``
(BOS, EOS, PAD) and ``posbench_extend.json`` (the run, the method, the length; ``method`` is None when the
adapter was folded in, ``merged`` names it), so ``--init DIR`` evaluates it as posbench's ``extend`` run did.
The logits are the run's: bitwise for ``tape`` and ``ntk`` (the same tensors and code), to float32 rounding
where an adapter was folded in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posbench.hf.export_dir import ExportError, building, check_target
from posbench.hf.loading import load_tokenizer, read_config_json
from posbench.hf.rope import llama_of, set_context
from posbench.hf.saving import load_extended, read_meta, write_extended

MODEL_SUBDIR = "checkpoint/model"


def export_extended(run_dir: Path, out_dir: Path, *, force: bool = False) -> dict[str, Any]:
    """Write the extended model of the ``extend`` run in ``run_dir`` to ``out_dir``; returns a description
    (``kind``, ``source``, ``tokenizer``, ``path``) like ``export_run``'s."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    model_dir = run_dir / MODEL_SUBDIR
    if not (run_dir / "result.json").is_file() or read_meta(model_dir) is None:
        raise ExportError(f"{run_dir} is an extend run that has not finished (no result.json and {MODEL_SUBDIR}/): "
                          f"continue it with 'posbench extend --resume {run_dir}'")
    check_target(out_dir, force)
    model, method, meta = load_extended(model_dir)
    tokenizer = load_tokenizer(model_dir)
    length = int(meta.get("length") or model.config.max_position_embeddings)
    set_context(llama_of(model).config, length)           # (an ntk run of an earlier posbench lacks n_positions)
    tokenizer.hf.model_max_length = length
    merged = method.merged(model) if method is not None else None
    description = {k: v for k, v in meta.items() if k not in ("format", "method", "method_options", "files", "llama")}
    description["exported_from"] = {"run": str(run_dir), "run_id": run_dir.name}
    if merged is not None:
        description["merged"] = {"method": method.name, "method_options": dict(method.options)}
    with building(out_dir, force) as tmp:
        write_extended(merged if merged is not None else model, None if merged is not None else method, tmp,
                       description, tokenizer)
    kind = (read_config_json(out_dir) or {}).get("model_type", "llama")
    return {"kind": kind, "path": str(out_dir), "tokenizer": {"kind": "hf"}, "length": length,
            "source": {"run": str(run_dir), "run_id": run_dir.name, "task": "extend",
                       "encoding": meta.get("label") or (method.name if method else "llama")}}
