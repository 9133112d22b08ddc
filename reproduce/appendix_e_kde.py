#!/usr/bin/env python
"""Appendix E: KDE plots of Table 1's per-sample scores (run reproduce/table1_generation.py first).

    python reproduce/appendix_e_kde.py                  # smoke preset (minutes on a CPU)
    python reproduce/appendix_e_kde.py --preset paper --device cuda

See attention_zoo/experiments/generation/appendix_e_kde.py; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from attention_zoo.experiments.generation.appendix_e_kde import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
