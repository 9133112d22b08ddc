"""The DAMCHA paper's claims as data, the statistics that test them and the verdicts computed from stored rows.

A layer of its own below ``experiments``: it reads result stores (``results/<folder>/<name>.jsonl``) and imports
nothing from ``experiments``. ``python -m attention_zoo.claims --results results/`` rebuilds the verdict table.
"""

from __future__ import annotations

from .data import StoreRows, by_phase, load_results
from .ledger import CLAIMS, get_claim
from .ledger_papers import paper_of
from .spec import Arm, Claim, Comparison
from .table import verdict_frame, verdict_lines, verdict_markdown
from .verdicts import Verdict, decide

PAPER_NAMES = ("tha", "dcmha", "colmha", "moa", "mma", "damcha")
PAPER_TITLES = {"tha": "Talking-Heads Attention (Shazeer et al. 2020)", "dcmha": "DCFormer (Xiao et al., ICML 2024)",
                "colmha": "Collaborative heads (Cordonnier et al. 2020)",
                "moa": "Mixture of Attention Heads (Zhang et al., EMNLP 2022)", "mma": "MMA (Cui et al., WNGT 2019)",
                "damcha": "the DAMCHA paper"}


def verdicts_for(results, experiments: tuple[str, ...] | None = None, paper: str | None = None) -> list[Verdict]:
    """The verdicts of every claim (or of those whose rows ``experiments`` make; of one ``paper``'s: ``tha``,
    ``dcmha``, ``colmha``, ``moa``, ``mma`` or ``damcha``) from the stores under ``results``.

    Raises:
        ValueError: an unknown ``paper``.
    """
    if paper is not None and paper not in PAPER_NAMES:
        raise ValueError(f"paper: expected one of {', '.join(PAPER_NAMES)}, got {paper!r}")
    claims = tuple(c for c in CLAIMS if (experiments is None or c.experiment in experiments)
                   and (paper is None or paper_of(c.id) == paper))
    return decide(load_results(results), claims)


def frame_verdicts(experiment: str, preset: str, frame, path=None, context: str = "", runs=()) -> list[Verdict]:
    """The verdicts of ``experiment``'s claims from one context's long frame (what a script's report shows)."""
    runs = sorted(set(frame["run_id"])) if "run_id" in frame and not runs else list(runs)
    claims = tuple(c for c in CLAIMS if c.experiment == experiment)
    stores = {(name, label): StoreRows(part, path, context, runs, [])
              for name in {c.store_name for c in claims} or {experiment}
              for label, part in by_phase(frame, preset).items()}
    return decide(stores, claims)


__all__ = ["PAPER_NAMES", "PAPER_TITLES", "Arm", "CLAIMS", "Claim", "Comparison", "Verdict", "decide", "frame_verdicts",
           "get_claim", "load_results", "paper_of", "verdict_frame", "verdict_lines", "verdict_markdown",
           "verdicts_for"]
