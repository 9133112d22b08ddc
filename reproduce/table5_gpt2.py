#!/usr/bin/env python
"""Table 5: character-level GPT-2 pretraining (Enwik8, Text8, Mix) — MHA vs DCMHA vs DAMCHA.

    python reproduce/table5_gpt2.py --preset smoke             # Shakespeare, minutes on a 2-core CPU
    python reproduce/table5_gpt2.py --preset paper --device cuda
    torchrun --nproc_per_node=8 reproduce/table5_gpt2.py --preset paper

See attention_zoo/experiments/lm/table5_gpt2.py for the presets; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.lm.table5_gpt2 import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
