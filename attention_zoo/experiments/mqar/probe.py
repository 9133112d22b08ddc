"""Behaviour probe of MQAR (``experiments.fingerprint``): one cell per arm and rung through ``mqar.unit_rows``
(``token_probe``)."""

from __future__ import annotations

from ..token_probe import unit_probe

PROBES = {"mqar": unit_probe("attention_zoo.experiments.mqar.mqar")}
