#!/usr/bin/env python
"""Table 1: decoder-only generation — 7 attention variants × CIFAR-10, CIFAR-100, WMT, CommonGen.

    python reproduce/table1_generation.py                      # smoke: digits + concept task, minutes on a CPU
    python reproduce/table1_generation.py --preset paper --device cuda
    python reproduce/table1_generation.py --image-task pixel --image-size 16 --variants mha,damcha

See attention_zoo/experiments/generation/table1_generation.py and generation.py for presets; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from attention_zoo.experiments.generation.table1_generation import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
