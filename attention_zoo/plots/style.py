"""One colour per arm across every figure; flavours, option rows and control arms by line style, hatch and marker
(the palette ``plots`` draws with)."""

from __future__ import annotations

# ---- palette and series styles ----------------------------------------------------------------------------------
# One colour per variant, the same in every figure, seven distinct hues (grey, blue, green, magenta, purple, olive,
# vermillion; colour-blind-safe Okabe-Ito / Tol tones): MHA, the reference, is dark grey; DAMCHA vermillion. Flavours
# and option rows differ by line style (lines) or hatch (bars). Control arms (docs/claims.md) have colours of their
# own, dash-dot lines, distinct markers and a hatch, so they never read as one of the seven methods.
VARIANT_COLOURS = {"mha": "#4d4d4d", "tha": "#0173b2", "dcmha": "#029e73", "colmha": "#cc78bc", "mma": "#7f3c8d",
                   "moa": "#999933", "damcha": "#d55e00"}
CONTROL_STYLES = {"mha_pm": ("#000000", "D"), "mha_ctx": ("#008695", "P"), "damcha_static": ("#e6ab02", "v"),
                  "damcha_bm": ("#f97b72", "X"), "mha_cm": ("#6a3d9a", "h"), "mha_sep": ("#b15928", "*")}
CONTROL_LINESTYLE, CONTROL_HATCH = "-.", "\\\\"
EXTRA_COLOURS = ("#56b4e9", "#332288", "#882255", "#e73f74", "#11a579", "#3969ac", "#80ba5a", "#44aa99",
                 "#aa4499", "#a5aa99")  # registered plugins: picked by a hash of the name, so always the same one
OTHER_COLOURS = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666", "#d95f02")
FLAVOUR_LINESTYLE = {"paper": "-", "damcha_repo": "--"}
FLAVOUR_HATCH = {"paper": "", "damcha_repo": "///"}
OPTION_LINESTYLE, OPTION_HATCH = ":", "..."  # rows with extra options, e.g. damcha[collapsed_generator=true]
REFERENCE_COLOUR = "#000000"  # non-variant series beside variants (an oracle, the paper's points)
UNSTABLE_HATCH = "xx"


def variant_colour(name: str) -> str:
    """The fixed colour of a variant; any other name (a plugin) gets one of EXTRA_COLOURS by a stable hash."""
    import zlib

    if name in VARIANT_COLOURS:
        return VARIANT_COLOURS[name]
    if name in CONTROL_STYLES:
        return CONTROL_STYLES[name][0]
    return EXTRA_COLOURS[zlib.crc32(name.encode()) % len(EXTRA_COLOURS)]


def _is_control(name: str) -> bool:
    from ..registry import get_attention_spec, is_attention

    return name in CONTROL_STYLES or (is_attention(name) and get_attention_spec(name).control)


def variant_palette(names: list[str] | None = None) -> dict[str, str]:
    """{variant name: colour} for ``names`` (default: every registered attention and the seven paper methods)."""
    if names is None:
        from ..registry import list_attentions

        names = sorted(set(VARIANT_COLOURS) | set(list_attentions()))
    return {n: variant_colour(n) for n in names}


def _is_variant(name: str) -> bool:
    if name in VARIANT_COLOURS:
        return True
    from ..registry import is_attention

    return is_attention(name)


def parse_label(label: str) -> tuple[str, str, bool]:
    """A series label -> (variant, flavour, has extra options). Labels read ``variant``, ``variant/flavour``,
    ``variant/flavour/s0``, ``variant/flavour causal`` or ``variant[key=value]``."""
    text = str(label)
    head = text.split(" ", 1)[0]
    variant = head.split("/", 1)[0].split("[", 1)[0]
    parts = head.split("/")
    flavour = "damcha_repo" if "damcha_repo" in parts[1:] else "paper"
    return variant, flavour, "[" in head


def sort_labels(labels) -> list[str]:
    """Series labels in one order for every figure: the paper's methods in table order (MHA first, DAMCHA last),
    then other variants by name, then the control arms; paper flavour before damcha_repo, option rows after;
    non-variant labels keep their order, after the arms."""
    order = {v: i for i, v in enumerate(VARIANT_COLOURS)}
    labels = list(dict.fromkeys(map(str, labels)))

    def key(item):
        i, lab = item
        v, flavour, options = parse_label(lab)
        if not _is_variant(v):
            return (3, 0, "", 0, 0, i)
        rank = 0 if v in order else (2 if _is_control(v) else 1)
        return (rank, order.get(v, 0), v, int(options), int(flavour != "paper"), i)

    return [lab for _, lab in sorted(enumerate(labels), key=key)]


class SeriesStyle(dict):
    """``color``, ``linestyle``, ``hatch``, ``marker`` of one plotted series (a dict, so it unpacks into kwargs)."""

    @property
    def line(self) -> dict:
        return {"color": self["color"], "linestyle": self["linestyle"], "marker": self["marker"]}


def series_styles(labels) -> dict[str, SeriesStyle]:
    """Style of every series label: variants by their fixed colour, flavour ``damcha_repo`` dashed / hatched, option
    rows dotted; labels that name no variant get black (beside variant series) or, in a figure of non-variant series
    (ablation rows, block scalings), OTHER_COLOURS in order."""
    labels = list(dict.fromkeys(map(str, labels)))
    parsed = {lab: parse_label(lab) for lab in labels}
    variant_like = {lab for lab, (v, _, _) in parsed.items() if _is_variant(v)}
    styles, other = {}, 0
    for lab in labels:
        v, flavour, options = parsed[lab]
        if lab in variant_like and _is_control(v):
            styles[lab] = SeriesStyle(color=variant_colour(v), linestyle=CONTROL_LINESTYLE, hatch=CONTROL_HATCH,
                                      marker=CONTROL_STYLES.get(v, ("", "d"))[1])
        elif lab in variant_like:
            styles[lab] = SeriesStyle(color=variant_colour(v),
                                      linestyle=OPTION_LINESTYLE if options else FLAVOUR_LINESTYLE[flavour],
                                      hatch=OPTION_HATCH if options else FLAVOUR_HATCH[flavour],
                                      marker="s" if options else "o")
        elif variant_like:
            styles[lab] = SeriesStyle(color=REFERENCE_COLOUR, linestyle=":", hatch="", marker="^")
        else:
            styles[lab] = SeriesStyle(color=OTHER_COLOURS[other % len(OTHER_COLOURS)], linestyle="-", hatch="",
                                      marker="o")
            other += 1
    return styles

# ---- verdicts (the report's forest plot) -----------------------------------------------------------------------
# One colour per verdict kind, apart from the arm colours (a verdict is not an arm): colour-blind-safe tones, the
# two decided kinds far apart (blue / vermillion), the undecided ones muted.
VERDICT_COLOURS = {"supported": "#0072b2", "contradicted": "#d55e00", "equivalent": "#009e73",
                   "explained by a control": "#cc79a7", "inconclusive": "#7f7f7f", "not decidable": "#b3b3b3"}
