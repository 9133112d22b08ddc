#!/usr/bin/env python
"""Table 6: ImageNet-1K ViT classification (top-1 / top-5) — MHA vs DCMHA vs DAMCHA.

    python reproduce/table6_vit.py --preset smoke                      # digits, about 2 minutes on a 2-core CPU
    python reproduce/table6_vit.py --preset cifar10 --device cuda      # CIFAR-10, a small ViT (mid-size option)
    python reproduce/table6_vit.py --preset paper --data-dir /data/imagenet --epochs 100
    torchrun --nproc_per_node=8 reproduce/table6_vit.py --preset paper --data-dir /data/imagenet

See attention_zoo/experiments/vision/table6_vit.py for the presets and the DeiT-style recipe; --help for every flag.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a program may choose for its process (the library sets nothing): large CPU tensors on huge pages, read by
# torch's allocator once, before its first allocation (docs/conventions.md, "CPU")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attention_zoo.experiments.vision.table6_vit import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
