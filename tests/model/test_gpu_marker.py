"""GPU tests are found by their ``gpu`` marker, not by a keyword: pytest counts folder names as keywords, so a
checkout in a folder named ``gpu`` skipped almost the whole suite on a CPU and reported success (issue 35)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine nothing is skipped")
@pytest.mark.slow  # pytest in a fresh process
def test_a_checkout_in_a_folder_named_gpu_runs_its_tests(tmp_path):
    folder = tmp_path / "gpu" / "tests"
    folder.mkdir(parents=True)
    shutil.copyfile(TESTS / "conftest.py", folder / "conftest.py")
    (folder / "test_some.py").write_text(
        "import pytest\n\n"
        "def test_plain():\n    assert True\n\n"
        "@pytest.mark.gpu\ndef test_on_a_gpu():\n    assert False\n")
    (tmp_path / "gpu" / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=tmp_path / "gpu", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
