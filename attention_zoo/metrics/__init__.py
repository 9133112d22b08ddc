"""Metrics for the generation tables (docs/experiments.md §3).

- ``metrics.images``: FID/KID through torch-fidelity (offline standard Inception weights), per-sample MSE and
  feature distance, FID@Top-50 as the authors select it.
- ``metrics.text``: per-example NLL, BERTScore (offline MiniLM), BARTScore (local ``facebook/bart-base``).
- ``metrics.topk``: the @Top-50 selection rules (``mse_top50``, ``nll_top50``, ``score_top50``, ``feature_top50``)
  and the per-sample score files they are recomputed from.

Submodules are imported explicitly (``from attention_zoo.metrics import images``): the image and text metrics pull
in torch-fidelity and transformers, which this package does not import eagerly.
"""
