"""The component benchmarks, run as `python -m specdec.bench.<module>` (bench/README.md); the
suite that `specdec bench` runs is product code, in specdec/benchmark/."""
