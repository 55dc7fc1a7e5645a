"""The benchmark suite behind `specdec bench` / `python -m bench` (bench/suite/run.py)."""
