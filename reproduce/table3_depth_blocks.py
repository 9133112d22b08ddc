#!/usr/bin/env python
"""Table 3: generator depth 1…9 × full / diagonal-only / off-diagonal-only inference (CIFAR-10 FID@Top-50).

    python reproduce/table3_depth_blocks.py                  # smoke preset (minutes on a CPU)
    python reproduce/table3_depth_blocks.py --preset paper --device cuda

See attention_zoo/experiments/generation/table3_depth_blocks.py; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from attention_zoo.experiments.generation.table3_depth_blocks import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
