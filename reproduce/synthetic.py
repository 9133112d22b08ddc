#!/usr/bin/env python
"""Appendix I, Figures 12–13: synthetic regression (test MSE vs λ) and classification (accuracy vs d_e).

    python reproduce/synthetic.py --lambda 0.2 1.0      # regression sweep only, all variants, seeds 0-4
    python reproduce/synthetic.py --de 4 8 12 16 20     # classification sweep only
    python reproduce/synthetic.py --preset paper        # both sweeps at the paper-like configuration

See attention_zoo/experiments/synthetic/sweep.py for the presets and attention_zoo/data/synthetic.py for the
generators; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.synthetic.sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
