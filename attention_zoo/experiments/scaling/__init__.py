"""The scale axis (docs/scaling.md): the character-LM stand-in of Table 5 on a ladder of model sizes, each arm tuned per
rung, its test loss against its training compute, its compute multiplier over MHA with a bootstrap interval and
DAMCHA's gap trend: ``presets``, ``ladder`` (cells, plan, CLI), ``rows`` (compute and stop columns), ``fit``,
``report``, ``probe``."""
