"""No function over MAX_LINES lines, anywhere in the repository: a function that long does several
things, and each of them deserves a name. Counted from the `def` line to the function's last
line (ast's end_lineno - lineno + 1, decorators excluded), for every function and method, nested
ones included, in every *.py file but a virtual environment's and the generated protobuf code."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60
GENERATED = ROOT / "specdec" / "v1"  # protoc's output (python -m specdec.cli.protogen)


def _python_files() -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        here = Path(dirpath)
        # Not the project's code: git's store, caches, a virtual environment by any name.
        dirnames[:] = [
            d
            for d in dirnames
            if d not in (".git", ".venv", "__pycache__")
            and here / d != GENERATED
            and not (here / d / "pyvenv.cfg").exists()
        ]
        files.extend(here / name for name in filenames if name.endswith(".py"))
    return sorted(files)


def _too_long(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]


def test_the_walk_sees_the_code_and_not_the_generated_protos():
    files = {str(p.relative_to(ROOT)) for p in _python_files()}
    assert {"specdec/cli/app.py", "coordinator/engine.py", "tests/unit/test_function_length.py"} <= files
    assert not [f for f in files if f.startswith(("specdec/v1/", ".venv/"))]


def test_no_function_is_over_the_limit():
    too_long = [found for path in _python_files() for found in _too_long(path)]
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named parts):\n" + "\n".join(too_long)
