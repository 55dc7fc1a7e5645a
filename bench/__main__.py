"""`python -m specdec.bench`: the benchmark suite (bench/suite/run.py), as `specdec bench`."""

import sys

from specdec.bench.suite.run import main

sys.exit(main())
