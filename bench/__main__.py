"""`python -m specdec.bench`: the benchmark suite (specdec/benchmark/run.py), as `specdec bench`."""

import sys

from specdec.benchmark.run import main

sys.exit(main())
