"""The package's structure: no import circle between its modules (imports inside functions count), a plain run
never enters ``posbench.hf``, one function writes ``result.json``, and each option is checked in one place."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "posbench"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """Every posbench module ``path`` imports, at any depth of its code (``from a import b`` names ``a.b`` when
    ``b`` is a module, else ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("posbench")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("posbench"):
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if is_module(sub) else node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_even_inside_a_function():
    graph = import_graph()
    assert len(graph) > 50 and "posbench.runs.runner" in graph["posbench.cli.run"]
    assert cycles(graph) == []


def test_the_layers_only_import_downwards():
    """Training knows nothing of tasks or runs; tasks nothing of runs, the report or the command line; nothing
    below the command line imports it."""
    graph = import_graph()

    def imported(prefix: str) -> set[str]:
        return {t for m, targets in graph.items() if m.startswith(prefix) for t in targets}

    assert not {t for t in imported("posbench.train") if t.startswith(("posbench.tasks", "posbench.runs"))}
    assert not {t for t in imported("posbench.tasks") if t.startswith(("posbench.runs", "posbench.report",
                                                                       "posbench.cli"))}
    assert not {t for m, ts in graph.items() if not m.startswith(("posbench.cli", "posbench.__main__")) for t in ts
                if t.startswith("posbench.cli")}


@pytest.mark.slow  # fresh processes, each a run
def test_a_plain_run_never_enters_the_hugging_face_package(tmp_path):
    """A posbench run from scratch (and one from another posbench run with --init) imports no ``posbench.hf``
    module: the Hugging Face layer is entered only for a pretrained model."""
    code = f"""
import sys
from posbench.cli import main
assert main(["run", "-e", "rope", "-t", "perplexity", "-p", "tiny", "-q", "--steps", "2", "-o", {str(tmp_path)!r},
             "--set", "task.length_factors=1"]) == 0
from pathlib import Path
first = next(Path({str(tmp_path)!r}).glob("perplexity/rope/*"))
assert main(["run", "-t", "perplexity", "-p", "tiny", "-q", "--init", str(first), "-o", {str(tmp_path)!r},
             "--set", "task.length_factors=1"]) == 0
print(sorted(m for m in sys.modules if m.startswith("posbench.hf")))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_one_function_writes_result_json():
    writers = [p for p in PACKAGE.rglob("*.py") if "RESULT_FILE" in p.read_text() and "atomic_write_json" in
               p.read_text() and "def write_record" in p.read_text()]
    assert [p.name for p in writers] == ["record.py"]
    callers = [p for p in PACKAGE.rglob("*.py") if "write_record(" in p.read_text()]
    assert sorted(p.name for p in callers) == ["record.py", "runner.py"]


def test_each_range_check_is_declared_once():
    """Ranges live in ``limits`` tables that ``posbench.options`` checks; no module repeats one by hand (an
    option compared with a number and refused right after: the old code did so in config.py, extend.py and each
    task's ``validate``)."""
    import re

    compared = re.compile(r"if .*(opts|options|o|train|model|sections\[\"\w+\"\])\[[\"'][a-z_]+[\"']\] *(<|<=|>|>=) *-?\d")
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            if compared.search(line) and "raise" in line + lines[i + 1]:
                offenders.append(f"{path.relative_to(PACKAGE)}:{i + 1}: {line.strip()}")
    assert offenders == []


def unit_of(module: str) -> str:
    """The README's name for the file or folder a module lives in: ``errors.py``, ``model/``, ``__main__.py``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "posbench/"
    return f"{parts[1]}/" if (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"


def readme_layers() -> list[list[str]]:
    """The README's architecture table: one list of files and folders per row, the lowest layer first."""
    import re

    text = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Architecture"):text.index("## Documentation")]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]+)`", row) for row in rows]


def test_the_readme_layer_table_names_every_module_once_and_every_import_goes_down():
    """The table is the map: every file and folder of the package is in exactly one row, and a module imports
    only from its own row or the rows above it (the package root, which holds the version, from anywhere)."""
    layers = readme_layers()
    row = {}
    for index, names in enumerate(layers):
        for name in names:
            assert name not in row, f"{name} is in two rows of the README's table"
            row[name] = index
    graph = import_graph()
    units = {unit_of(m) for m in graph} - {"posbench/"}
    assert units == set(row), f"missing from the table: {sorted(units - set(row))}; " \
                              f"not in the package: {sorted(set(row) - units)}"
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                    if unit_of(t) != "posbench/" and row[unit_of(t)] > row[unit_of(m)])
    assert upward == []


def test_the_layer_check_finds_an_import_that_goes_up():
    """The check above can fail: an import from a lower row to a higher one is found."""
    layers = readme_layers()
    row = {name: i for i, names in enumerate(layers) for name in names}
    assert row["errors.py"] < row["model/"] < row["tasks/"] < row["cli/"]
    graph = {"posbench.errors": {"posbench.cli.app"}}
    upward = [f"{m} -> {t}" for m, targets in graph.items() for t in targets if row[unit_of(t)] > row[unit_of(m)]]
    assert upward == ["posbench.errors -> posbench.cli.app"]


@pytest.mark.slow  # three fresh processes
def test_the_model_and_the_encodings_import_in_either_order():
    """The encodings import ``posbench.model.bias`` and ``posbench.model.generate``, and the model the encodings'
    registry: whichever is imported first, in a fresh interpreter, both load and build a model."""
    for first in ("posbench.encodings", "posbench.model.bias", "posbench.model"):
        code = (f"import {first}\nfrom posbench.model import ModelConfig, Transformer\n"
                f"Transformer(ModelConfig(encoding='dape'))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              cwd=PACKAGE.parent)
        assert done.returncode == 0, f"import {first} first: {done.stderr[-1500:]}"
