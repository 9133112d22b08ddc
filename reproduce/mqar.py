#!/usr/bin/env python
"""MQAR (multi-query associative recall, Zoology) for the seven variants and the controls: a capability ladder, and
the stand-in for DCFormer's in-context claim.

    python reproduce/mqar.py --preset smoke                                   # every arm, one seed, 300 steps
    python reproduce/mqar.py --preset decide --out results/mqar_decide        # tuned arms, 10 (5) seeds, ~CPU-hours
    python reproduce/mqar.py --preset decide --out results/mqar_decide --paper dcmha --dry-run

See attention_zoo/experiments/mqar/presets.py for the ladder, the arms and the recipe; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attention_zoo.experiments.mqar.mqar import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
