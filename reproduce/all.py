#!/usr/bin/env python
"""Every table and figure at one preset, then results/README.md.

    python reproduce/all.py --preset smoke --device cpu
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.run_all import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
