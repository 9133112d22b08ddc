#!/usr/bin/env python
"""Table 4: DAMCHA without sharing, without f(x), without both (CIFAR-10, CommonGen).

    python reproduce/table4_ablation.py                  # smoke preset (minutes on a CPU)
    python reproduce/table4_ablation.py --preset paper --device cuda

See attention_zoo/experiments/generation/table4_ablation.py; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from attention_zoo.experiments.generation.table4_ablation import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
