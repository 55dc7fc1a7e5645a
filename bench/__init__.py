"""The benchmarks: `specdec bench` (suite/), and the component benchmarks run as
`python -m specdec.bench.<module>` (bench/README.md)."""
