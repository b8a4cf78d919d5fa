"""A TAPE-extended Llama as a transformers model of its own (``model_type: posbench_tape_llama``), so that it
leaves posbench with its TAPE: ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` builds it
(posbench must be installed: the two small remote-code files import this module), and without posbench's code
transformers refuses the directory (an unknown model type that needs ``trust_remote_code``) instead of
loading a plain Llama with the TAPE weights dropped.

``TapeLlamaConfig`` is a ``LlamaConfig`` plus TAPE's options (``tape_position_size``, ``tape_gate``,
``tape_random_offset``); ``TapeLlamaForCausalLM`` is a ``LlamaForCausalLM`` converted by
``posbench.hf.tape_llama.convert_to_tape`` when it is built, so its tensors are the converted model's, under the
same names (``model.layers.<i>.tape.*`` beside the Llama's), and its logits are what posbench computes.
Importing this module registers both with the Auto classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from posbench.hf.tape_llama import convert_to_tape

MODEL_TYPE = "posbench_tape_llama"
AUTO_MAP = {"AutoConfig": "configuration_posbench_tape_llama.TapeLlamaConfig",
            "AutoModelForCausalLM": "modeling_posbench_tape_llama.TapeLlamaForCausalLM"}
REMOTE_FILES = {
    "configuration_posbench_tape_llama.py": '"""A TAPE-extended Llama from posbench (trust_remote_code): the class lives '
                                            'in posbench, which must be installed."""\n'
                                            'from posbench.hf.tape_model import TapeLlamaConfig  # noqa: F401\n',
    "modeling_posbench_tape_llama.py": '"""A TAPE-extended Llama from posbench (trust_remote_code): the class lives in '
                                       'posbench, which must be installed."""\n'
                                       'from posbench.hf.tape_model import TapeLlamaForCausalLM  # noqa: F401\n',
}


class TapeLlamaConfig(LlamaConfig):
    model_type = MODEL_TYPE

    tape_position_size: int = 0            # 0: 4 x heads
    tape_gate: str = "rowsum"
    tape_random_offset: bool = False       # acts in training only

    @classmethod
    def from_llama(cls, config: LlamaConfig, options: dict[str, Any]) -> TapeLlamaConfig:
        values = {k: v for k, v in config.to_dict().items() if not k.startswith("tape_") and
                  k not in ("model_type", "architectures", "auto_map", "transformers_version")}
        made = cls(**values, tape_position_size=int(options.get("position_size", 0)),
                   tape_gate=str(options.get("gate", "rowsum")),
                   tape_random_offset=bool(options.get("random_offset", False)))
        made.architectures = ["TapeLlamaForCausalLM"]
        made.auto_map = dict(AUTO_MAP)
        return made


class TapeLlamaForCausalLM(LlamaForCausalLM):
    config_class = TapeLlamaConfig

    def __init__(self, config: TapeLlamaConfig):
        super().__init__(config)
        convert_to_tape(self, config.tape_position_size, config.tape_gate, config.tape_random_offset)


def write_tape_files(config: LlamaConfig, options: dict[str, Any], directory: Path) -> list[str]:
    """``config.json`` as a ``TapeLlamaConfig`` and the remote-code files, in a directory where a converted
    model's whole state dict was saved; returns the files written besides the weights."""
    TapeLlamaConfig.from_llama(config, options).save_pretrained(str(directory))
    for name, text in REMOTE_FILES.items():
        (Path(directory) / name).write_text(text, encoding="utf-8")
    return ["config.json", *REMOTE_FILES]


def register() -> None:
    AutoConfig.register(MODEL_TYPE, TapeLlamaConfig, exist_ok=True)
    AutoModelForCausalLM.register(TapeLlamaConfig, TapeLlamaForCausalLM, exist_ok=True)


register()
