#!/usr/bin/env python
"""Table 7: complexity of MHA vs DAMCHA (formulas and numbers), measured scaling exponents of every registered
attention, and parameter counts under the readings of P.

    python reproduce/table7_complexity.py --device cpu          # smoke: T up to 1024, D up to 128, ~3 min
    python reproduce/table7_complexity.py --preset paper --device cuda   # T 128…4096 at D=512

See attention_zoo/experiments/efficiency/table7_complexity.py; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.efficiency.table7_complexity import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
