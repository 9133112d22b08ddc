#!/usr/bin/env python
"""Appendices F–H: DAMCHA metric heatmaps over training, static vs adaptive, block-wise gradient norms.

    python reproduce/appendix_fgh.py --device cpu      # smoke: digits masked-patch task, a few minutes
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.generation.appendix_fgh import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
