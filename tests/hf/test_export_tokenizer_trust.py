"""An export of posbench's own model type loads as docs/pretrained.md says, without an interactive question (issue
48, item 12): ``AutoTokenizer.from_pretrained`` reads the directory's config.json, whose ``auto_map`` names the
model's code, and without ``trust_remote_code=True`` transformers stops to ask whether to run it ("Do you wish to
run the custom code? [y/N]"); the page gave the flag for the model only. The page's own snippet is run here, in a
fresh process that has not imported posbench, offline, with no terminal to answer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hf.test_hf_export import export, fake_run

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Do you wish to run the custom code"


def documented_snippet() -> str:
    """The python block of docs/pretrained.md that loads an export with ``AutoTokenizer``."""
    page = (ROOT / "docs" / "pretrained.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "AutoTokenizer.from_pretrained" in b]
    assert len(blocks) == 1, "docs/pretrained.md shows how to load an export's model and tokenizer in one block"
    return blocks[0]


@pytest.mark.slow                   # a fresh process imports transformers and posbench: about 25 s on 2 cores
def test_the_documented_way_loads_the_model_and_tokenizer_without_a_question(tmp_path, capsys):
    snippet = documented_snippet()
    assert "AutoTokenizer.from_pretrained(\"exported/tape\", trust_remote_code=True)" in snippet
    out = export(capsys, fake_run(tmp_path, "tape"), tmp_path / "exported" / "tape")
    script = f"""import sys
{snippet}
assert not isinstance(model, type(None)) and type(model).__name__ == "PosbenchForCausalLM", type(model)
assert tokenizer("héllo <eos>")["input_ids"] == list("héllo <eos>".encode())
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "modules"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=out.parents[1], env=env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    assert QUESTION not in done.stdout + done.stderr


def test_the_export_says_both_need_the_flag(tmp_path, capsys):
    """The line ``posbench export`` prints names the tokenizer too."""
    from posbench.cli import main

    run = fake_run(tmp_path, "alibi")
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    line = capsys.readouterr().out
    assert "pass trust_remote_code=True to the model and the tokenizer" in " ".join(line.split())
