"""bench/ holds the component benchmarks only: product code lives in the packages (`specdec bench`
in specdec/benchmark/, with its prompt text), fixtures under tests/. The measure is bench/'s share
of the project's Python lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH_SHARE = 0.20  # the most of the project's Python lines that bench/ may hold
# Not the project's own lines: the tests, virtual environments, generated protobuf code, build output.
EXCLUDED = ("tests", ".venv", "build", "specdec/v1")


def python_lines(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if not any(rel == part or rel.startswith(part + "/") for part in EXCLUDED):
            total += len(path.read_text(encoding="utf-8").splitlines())
    return total


def test_bench_is_at_most_a_fifth_of_the_project():
    bench, project = python_lines(ROOT / "bench"), python_lines(ROOT)
    assert bench <= BENCH_SHARE * project, (
        f"bench/ holds {bench:,} of the project's {project:,} Python lines outside tests/ "
        f"({bench / project:.0%}); at most {BENCH_SHARE:.0%} ({int(BENCH_SHARE * project):,} lines)"
    )
