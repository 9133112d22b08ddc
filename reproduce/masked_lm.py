#!/usr/bin/env python
"""A masked character LM (bidirectional) for the baselines' own claims: THA, MoA, ColMHA and MMA
(the arms and sweeps of each paper).

    python reproduce/masked_lm.py --preset smoke                              # every arm, one seed, 300 steps
    python reproduce/masked_lm.py --preset decide --out results/masked_lm_decide  # tuned arms, 10 seeds
    python reproduce/masked_lm.py --preset decide --out results/masked_lm_decide --paper tha --dry-run

See attention_zoo/experiments/mlm/presets.py for the arms and the recipe; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attention_zoo.experiments.mlm.masked_lm import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
