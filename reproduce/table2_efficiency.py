#!/usr/bin/env python
"""Table 2: efficiency (memory, latency, GFLOPs, parameters) of every registered attention.

    python reproduce/table2_efficiency.py --device cpu          # smoke: compact config, batch 1, ~1-2 min
    python reproduce/table2_efficiency.py --device cuda         # compact config at the paper's batches
    python reproduce/table2_efficiency.py --preset paper --device cuda   # Section 5.1 model

See attention_zoo/experiments/efficiency/table2_efficiency.py for what is measured and how; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.efficiency.table2_efficiency import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
