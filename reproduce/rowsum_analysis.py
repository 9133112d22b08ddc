#!/usr/bin/env python
"""DAMCHA under RowSum: gradient identity, collapsed-generator equivalence, diagonal-only vs full/H, costs.

    python reproduce/rowsum_analysis.py --device cpu     # smoke char-LM on Shakespeare; costs at B=4, T=512, D=256
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.efficiency.rowsum_analysis import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
