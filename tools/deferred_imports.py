"""The imports that sit inside function bodies (deferred), per file: which say why on their line (a comment) and
which do not. Issue 58: at most 60, each with its reason.

    python tools/deferred_imports.py            # a count per file, then every one without a reason
    python tools/deferred_imports.py --all      # every deferred import, with its line
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "posbench"


def deferred_imports(root: Path = PACKAGE) -> list[tuple[Path, int, str]]:
    """``(file, line number, the line)`` of every import inside a function body under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        found.append((path, inner.lineno, lines[inner.end_lineno - 1]))
    return sorted(set(found))


def has_reason(line: str) -> bool:
    return "#" in line


def main() -> int:
    found = deferred_imports()
    counts = Counter(path.relative_to(PACKAGE.parent) for path, _, _ in found)
    for path, n in counts.most_common():
        print(f"{n:4d}  {path}")
    bare = [f for f in found if not has_reason(f[2])]
    print(f"{len(found)} deferred imports in {len(counts)} files; {len(bare)} without a reason on their line")
    for path, line, text in (found if "--all" in sys.argv else bare):
        print(f"{path.relative_to(PACKAGE.parent)}:{line}: {text.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
