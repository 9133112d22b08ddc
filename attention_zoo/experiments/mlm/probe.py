"""Behaviour probe of the masked LM (``experiments.fingerprint``): one cell per arm through ``masked_lm.unit_rows``
(``token_probe``)."""

from __future__ import annotations

from ..token_probe import unit_probe

PROBES = {"masked_lm": unit_probe("attention_zoo.experiments.mlm.masked_lm")}
