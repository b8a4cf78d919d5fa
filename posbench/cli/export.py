"""``posbench export``: a run's trained model and tokenizer as a Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from posbench.cli.common import out, user_errors
from posbench.cli.shared_options import Force
from posbench.hf.export import export_run        # transformers: this command always needs it
from posbench.hf.tape_model import MODEL_TYPE

EXPORT_EPILOG = """[bold]Examples[/bold]

  posbench export results/pretrain/rope/20250101-120000-ab12cd exported/rope

  posbench export results/arithmetic/tape/20250101-120000-ab12cd exported/tape

  posbench extend --model exported/rope --method lora --length 1024 --data stdlib

  posbench export results/extend/llama+tape/20250101-120000-ab12cd exported/llama-tape    (TAPE kept: trust_remote_code)
"""


def export(
    run_dir: Path,
    out_dir: Path,
    force: Force = False,
) -> None:
    """Export a run's model and tokenizer as a Hugging Face model directory (RoPE: a plain Llama).

    RUN_DIR: a finished (or checkpointed) posbench run directory; OUT_DIR: the new model directory (new or empty).

    AutoModelForCausalLM and AutoTokenizer.from_pretrained(OUT_DIR) load it. Any encoding but RoPE is posbench's
    own model type (model_type 'posbench'): pass trust_remote_code=True to both (AutoTokenizer reads config.json
    too, and asks otherwise). An extend run's model keeps its method:
    LoRA folded into a plain Llama (yarn, ntk: transformers' rope parameters), TAPE as its own model type."""
    with user_errors():
        meta = export_run(run_dir, out_dir, force=force)
    source = meta["source"]
    if meta["kind"] == "llama":
        how = "LlamaForCausalLM"
    else:
        name = "TapeLlamaForCausalLM" if meta["kind"] == MODEL_TYPE else "PosbenchForCausalLM"
        how = f"{name}: pass trust_remote_code=True to the model and the tokenizer (posbench must be installed)"
    out().print(f"[bold]export[/bold] {source['task']} / [bold]{source['encoding']}[/bold] "
                f"({meta['tokenizer']['kind']} tokenizer) -> {escape(meta['path'])}  {escape(f'[{how}]')}")
