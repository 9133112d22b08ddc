"""The performance targets the project holds its variants to, checked against the quick benchmark's rows (never in
timed unit tests), in both timing settings: the benchmark's own and a user's plain training loop (``plain_loop``)."""

from __future__ import annotations

# Performance targets, checked against this benchmark's rows (never in timed unit tests): (what, case, its
# reference case or None for % of the GEMM rate, the compared value, the bound it must not exceed / fall below).
TARGETS = (
    ("MHA layer, % of the GEMM rate", "mha layer non-causal", None, "achieved_gflops", ">=", 65.0),
    ("DAMCHA shared decoder / MHA decoder, fwd+bwd time", "damcha decoder", "mha decoder", "fwd_bwd_ms", "<=", 2.0),
    ("DCMHA layer / MHA, fwd+bwd time (non-causal)", "dcmha layer non-causal", "mha layer non-causal",
     "fwd_bwd_ms", "<=", 2.5),
    ("DCMHA layer / MHA, fwd+bwd time (causal)", "dcmha layer causal", "mha layer causal", "fwd_bwd_ms", "<=", 2.0),
    ("DCMHA decoder / MHA decoder, peak memory", "dcmha decoder", "mha decoder", "peak_mib", "<=", 3.0),
    ("THA layer / MHA, fwd+bwd time (non-causal)", "tha layer non-causal", "mha layer non-causal", "fwd_bwd_ms",
     "<=", 1.4),
    ("THA layer / MHA, fwd+bwd time (causal)", "tha layer causal", "mha layer causal", "fwd_bwd_ms", "<=", 1.4),
    ("THA decoder / MHA decoder, peak memory", "tha decoder", "mha decoder", "peak_mib", "<=", 2.5),
    ("MoA layer, % of the GEMM rate (non-causal)", "moa layer non-causal", None, "achieved_gflops", ">=", 50.0),
    ("MoA layer, % of the GEMM rate (causal)", "moa layer causal", None, "achieved_gflops", ">=", 50.0),
    ("DAMCHA layer / MHA, fwd+bwd time (non-causal)", "damcha layer non-causal", "mha layer non-causal",
     "fwd_bwd_ms", "<=", 1.5),
    ("DAMCHA collapsed layer / MHA, fwd+bwd time (non-causal)", "damcha[collapsed_generator=true] layer non-causal",
     "mha layer non-causal", "fwd_bwd_ms", "<=", 1.0),
)


def _find(rows: dict, prefix: str) -> dict | None:
    """The row whose label is ``prefix`` or starts with it (decoder labels carry the layer count)."""
    for label, r in rows.items():
        if (label == prefix or label.startswith(prefix + " ")) and r.get("status") == "ok":
            return r
    return None


def _value(r: dict, b: dict | None, key: str, gemm: float) -> float | None:
    if r.get(key) is None or (b is not None and not b.get(key)):
        return None
    return 100 * r[key] / gemm if b is None else r[key] / b[key]


def summary_lines(rows: dict, gemm: float) -> list[str]:
    """One line per target whose cases ran: the value in the benchmark's timing setting and, for time ratios, in
    a plain training loop (the one a user gets, and the one the verdict is on where it was measured); the bound
    and the verdict (unstable noted)."""
    out = []
    for what, case, ref, key, op, bound in TARGETS:
        r, b = _find(rows, case), _find(rows, ref) if ref else None
        if r is None or (ref and b is None):
            continue
        value = _value(r, b, key, gemm)
        if value is None:
            continue
        plain = _value(r, b, "plain_ms", gemm) if key == "fwd_bwd_ms" and ref else None
        judged = plain if plain is not None else value
        ok = judged >= bound if op == ">=" else judged <= bound
        timed = key != "peak_mib"
        shaky = " (timing unstable)" if timed and (r.get("unstable") or (b or {}).get("unstable")) else ""
        unit = " %" if ref is None else "x"
        both = (f"{value:.2f}{unit} in the benchmark's setting, {plain:.2f}{unit} in a plain AdamW loop (fwd+bwd)"
                if plain is not None else f"{value:.2f}{unit}")
        where = " in the plain loop" if plain is not None else ""
        out.append(f"{what}: {both} (target {op} {bound:g}{unit}): {'meets' if ok else 'misses'} target{where}"
                   f"{shaky}")
    return out




__all__ = ["TARGETS", "summary_lines"]
