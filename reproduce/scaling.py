#!/usr/bin/env python
"""The scale axis: every arm's test loss against its training compute on a ladder of char-LM sizes (Table 5's
stand-in), its compute multiplier over MHA with a bootstrap interval, and DAMCHA's gap trend.

    python reproduce/scaling.py --preset decide --out results/scaling_decide --dry-run   # the plan and its cost
    python reproduce/scaling.py --preset decide --out results/scaling_decide            # ≈ 9 h on 2 cores

See attention_zoo/experiments/scaling/ladder.py for the ladder; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as the other training scripts (docs/conventions.md, "CPU")

from attention_zoo.experiments.scaling.ladder import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
