"""Figure rules: one fixed colour per variant in every figure, flavours by line style or hatch, legends outside the
data, one unit per axis, log-log scaling plots, KDEs of non-negative scores bounded at 0."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from attention_zoo import plots, report  # noqa: E402
from attention_zoo.experiments.efficiency import table2_efficiency, table7_complexity  # noqa: E402
from attention_zoo.registry import list_attentions  # noqa: E402

PAPER_METHODS = ("mha", "tha", "dcmha", "colmha", "mma", "moa", "damcha")


@pytest.fixture
def figures(monkeypatch):
    """Keep every figure the report helpers save (they close it afterwards; the artists stay readable)."""
    saved = {}

    def keep(fig, path, **kwargs):
        saved[str(path).rsplit("/", 1)[-1]] = fig
        return path

    monkeypatch.setattr(plots, "atomic_savefig", keep)
    yield saved
    plt.close("all")


def _lines(fig) -> dict[str, object]:
    return {ln.get_label(): ln for ax in fig.axes for ln in ax.get_lines() if not ln.get_label().startswith("_")}


def test_palette_is_fixed_distinct_and_covers_every_registered_variant():
    pal = plots.variant_palette()
    assert set(PAPER_METHODS) <= set(pal) and set(list_attentions()) <= set(pal)
    assert len({pal[v] for v in PAPER_METHODS}) == len(PAPER_METHODS)
    assert plots.variant_palette(["damcha"]) == {"damcha": plots.VARIANT_COLOURS["damcha"]}
    # a plugin's colour is deterministic (a hash of its name), never one of the seven methods'
    assert plots.variant_colour("mine") == plots.variant_colour("mine")
    assert plots.variant_colour("mine") not in plots.VARIANT_COLOURS.values()
    # the control arms: colours, line style and markers of their own
    controls = [n for n in list_attentions(include_controls=True) if n not in list_attentions()]
    styles = plots.series_styles(["mha/paper", "damcha/paper", *controls])
    for c in controls:
        assert styles[c]["linestyle"] == plots.CONTROL_LINESTYLE and styles[c]["hatch"]
        assert styles[c]["color"] not in plots.VARIANT_COLOURS.values()
    assert len({styles[c]["marker"] for c in controls}) == len(controls)
    assert plots.sort_labels([*controls, "damcha/paper", "mha/paper"])[:2] == ["mha/paper", "damcha/paper"]


def test_series_styles_parse_labels_flavours_and_options():
    s = plots.series_styles(["damcha/paper", "tha/damcha_repo/s1", "damcha[collapsed_generator=true]",
                              "mha/paper causal", "oracle (knows R)"])
    assert s["damcha/paper"]["color"] == s["damcha[collapsed_generator=true]"]["color"] == "#d55e00"
    assert s["tha/damcha_repo/s1"]["linestyle"] == "--" and s["tha/damcha_repo/s1"]["hatch"]
    assert s["damcha/paper"]["linestyle"] == "-" and not s["damcha/paper"]["hatch"]
    assert s["damcha[collapsed_generator=true]"]["linestyle"] == ":"
    assert s["mha/paper causal"]["color"] == plots.VARIANT_COLOURS["mha"]
    assert s["oracle (knows R)"]["color"] == plots.REFERENCE_COLOUR  # a reference beside the variants
    other = plots.series_styles(["full", "diag_only"])  # no variants: a qualitative palette
    assert other["full"]["color"] != other["diag_only"]["color"]


def test_same_colour_for_a_variant_across_figures_and_dashed_damcha_repo(figures, tmp_path):
    seeds = range(3)
    a = pd.DataFrame([{"label": lab, "x": x, "y": x + s} for lab in ("mha/paper", "damcha/paper", "tha/damcha_repo")
                      for x in (1, 2, 3) for s in seeds])
    b = pd.DataFrame([{"label": lab, "x": x, "y": x * s} for lab in ("damcha/paper", "moa/paper", "moa/damcha_repo")
                      for x in (1, 2) for s in seeds])
    plots.line_plot(a, "x", "y", "label", tmp_path / "a.png", "A", "y (units)")
    plots.line_plot(b, "x", "y", "label", tmp_path / "b.png", "B", "y (units)")
    la, lb = _lines(figures["a.png"]), _lines(figures["b.png"])
    assert to_hex(la["damcha/paper"].get_color()) == to_hex(lb["damcha/paper"].get_color()) == "#d55e00"
    assert la["tha/damcha_repo"].get_linestyle() == "--" and lb["moa/damcha_repo"].get_linestyle() == "--"
    assert la["damcha/paper"].get_linestyle() == "-"
    assert to_hex(lb["moa/paper"].get_color()) == to_hex(lb["moa/damcha_repo"].get_color())
    # 95 % bands from the three seeds: one filled band per series
    assert sum(len(ax.collections) for ax in figures["a.png"].axes) >= 3
    # the legend sits outside the data (to the right of the axes)
    leg = figures["a.png"].axes[-1].get_legend()
    assert leg is not None and leg._loc == 2 and leg.get_bbox_to_anchor().x0 > figures["a.png"].axes[-1].bbox.x1


def test_bar_plot_colours_by_variant_and_hatches_damcha_repo(figures, tmp_path):
    df = pd.DataFrame([{"dataset": d, "label": lab, "value": v + s} for d in ("digits", "concepts")
                       for lab, v in (("damcha/paper", 1.0), ("dcmha/damcha_repo", 2.0), ("dcmha/paper", 3.0))
                       for s in range(3)])
    plots.bar_plot(df, "dataset", "value", "label", tmp_path / "bars.png", "T", "FID (units)")
    ax = figures["bars.png"].axes[0]
    order = plots.sort_labels(["damcha/paper", "dcmha/damcha_repo", "dcmha/paper"])
    assert order == ["dcmha/paper", "dcmha/damcha_repo", "damcha/paper"]  # table order, paper flavour first
    by_label = dict(zip(order, ax.containers))
    assert all(to_hex(b.get_facecolor()) == "#d55e00" for b in by_label["damcha/paper"])
    assert all(b.get_hatch() == plots.FLAVOUR_HATCH["damcha_repo"] for b in by_label["dcmha/damcha_repo"])
    assert all(not b.get_hatch() for b in by_label["dcmha/paper"])
    assert len(ax.get_lines()) >= 6  # an error bar per bar (95 % t-interval over the 3 seeds)


def test_table2_figures_one_unit_per_axis_shared_gflop_scale_and_variant_colours(figures, tmp_path):
    rows = []
    for v, f in (("mha", "paper"), ("damcha", "paper"), ("tha", "damcha_repo")):
        for metric, unit, val in (("fwd_gflops_analytic", "GFLOP", 1.0), ("flop_counter_gflops", "GFLOP", 1.1),
                                  ("fvcore_gmacs", "GMAC", 0.5), ("latency_fwd_median_ms", "ms", 3.0),
                                  ("latency_fwd_q25_ms", "ms", 2.5), ("latency_fwd_q75_ms", "ms", 3.5),
                                  ("peak_train_rss_mib", "MiB", 10.0)):
            rows.append({"setting": "CIFAR-10/100", "seq_len": 64, "batch": 1, "device": "cpu", "preset": "smoke",
                         "variant": v, "flavour": f, "metric": metric, "unit": unit, "value": val, "status": "ok",
                         "unstable": v == "tha"})
    paths = table2_efficiency.plots(pd.DataFrame(rows), tmp_path)
    names = {p.name if hasattr(p, "name") else str(p).rsplit("/", 1)[-1] for p in paths}
    assert "table2_efficiency_gflops_cifar-10.png" in names
    assert not any("gmacs" in n for n in names)  # fvcore's MACs are half the FLOPs: no duplicate figure
    gflops = figures["table2_efficiency_gflops_cifar-10.png"]
    assert all("GFLOP" in ax.get_xlabel() and "GMAC" not in ax.get_xlabel() for ax in gflops.axes)
    assert len({ax.get_xlim() for ax in gflops.axes}) == 1  # the counts share one scale
    memory = figures["table2_efficiency_memory_cifar-10.png"]
    assert "CPU RSS increment" in memory.axes[0].get_xlabel()
    assert "smoke preset, cpu; CPU RSS increment, batch 1" in " ".join(memory._suptitle.get_text().split())  # wrapped
    lat = figures["table2_efficiency_latency_cifar-10.png"].axes[0]
    bars = {lat.get_yticklabels()[round(b.get_y() + b.get_height() / 2)].get_text(): b for b in lat.patches}
    assert to_hex(bars["damcha/paper"].get_facecolor()) == "#d55e00"
    assert bars["tha/damcha_repo"].get_hatch() == plots.UNSTABLE_HATCH  # unstable: faded, cross-hatched
    assert bars["tha/damcha_repo"].get_alpha() < 1


def test_a_long_figure_title_wraps_to_the_figure_width_instead_of_widening_the_image():
    # the quick benchmark's one-line title of ~330 characters once made its image 3.4k pixels wide, panels squeezed
    fig, _ = plt.subplots(1, 2, figsize=(8, 3))
    words = [f"word{i}" for i in range(80)]
    plots.suptitle(fig, "Short first line\n" + " ".join(words))
    text = fig._suptitle.get_text()
    assert text.split() == ["Short", "first", "line", *words]  # nothing lost, only line breaks added
    assert text.count("\n") >= 3
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert box.width <= fig.bbox.width  # the title fits above the panels
    plt.close(fig)


@pytest.mark.parametrize("seeds, words, title", [(3, "range of the seeds", "mean and range of the seeds"),
                                                  (6, "95 % t interval", "mean and 95 % interval")])
def test_a_delta_figure_names_its_whiskers_a_t_interval_only_from_five_seeds(figures, tmp_path, seeds, words, title):
    # below five seeds delta_frame's whiskers are the seeds' min and max; the smoke figures once called them 95 % t
    from attention_zoo.claims.paired import delta_frame

    rng = np.random.default_rng(0)
    rows = pd.DataFrame([{"variant": v, "flavor": "paper", "seed": s, "metric": "mse", "status": "ok",
                          "value": 1.0 + rng.normal(0, 0.1)} for v in ("mha", "damcha") for s in range(seeds)])
    deltas = delta_frame(rows, ["metric"], {"variant": "mha", "flavor": "paper"})
    plots.delta_plot(deltas, "metric", tmp_path / "d.png", "Table X: " + plots.interval_title(deltas), "x (%)",
                     reference="MHA/paper")
    fig = figures["d.png"]
    legend = [t.get_text() for ax in fig.axes for leg in [ax.get_legend()] if leg for t in leg.get_texts()]
    assert any(t.startswith(words) for t in legend), legend
    assert title in fig._suptitle.get_text()
    if seeds < 5:  # the whisker drawn is the seeds' range, and nothing calls it an interval of confidence
        low, high = deltas.loc[0, ["low", "high"]]
        d = 100 * (rows[rows.variant == "damcha"]["value"].to_numpy() - rows[rows.variant == "mha"]["value"].to_numpy()
                   ) / rows[rows.variant == "mha"]["value"].abs().to_numpy()
        assert (low, high) == pytest.approx((d.min(), d.max()))
        assert not any("t interval" in t for t in legend + [fig._suptitle.get_text()])


def test_table7_scaling_plots_are_log_log_with_one_line_per_variant(figures, tmp_path):
    rows = [{"variant": v, "flavour": f, "causal": c, "seq_len": T, "d_model": 64, "metric": "fwd_gflops_analytic",
             "unit": "GFLOP", "value": T * (2 if v == "damcha" else 1), "status": "ok", "preset": "smoke",
             "device": "cpu", "batch": 1, "n_heads": 4}
            for v, f in (("mha", "paper"), ("mma", "paper"), ("damcha", "paper"), ("tha", "damcha_repo"))
            for c in (False, True) for T in (128, 256, 512)]
    df = pd.DataFrame(rows)  # MMA's values equal MHA's: the nested markers must keep both visible
    table7_complexity.scaling_plots(df, df.iloc[0:0], tmp_path)
    fig = figures["table7_complexity_fwd_gflops_analytic_vs_seq_len.png"]
    assert len(fig.axes) == 2  # non-causal and causal panels
    title = fig._suptitle.get_text()
    assert title.count("(") == title.count(")") and "smoke preset, cpu" in title and "D = 64" in title
    for ax in fig.axes:
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
        assert set(lines) == {"damcha/paper", "mha/paper", "mma/paper", "tha/damcha_repo", "∝ T¹", "∝ T²"}
        sizes = {lab: lines[lab].get_markersize() for lab in ("mha/paper", "mma/paper")}
        assert sizes["mha/paper"] != sizes["mma/paper"]  # concentric rings, not one marker hiding the other
        ref = lines["∝ T²"]
        x, y = ref.get_xdata(), ref.get_ydata()
        assert np.log(y[-1] / y[0]) / np.log(x[-1] / x[0]) == pytest.approx(2.0)


def test_kde_of_non_negative_scores_is_bounded_at_zero():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"mse": np.concatenate([rng.exponential(0.05, 200), rng.exponential(0.08, 200)]),
                       "label": ["mha/paper"] * 200 + ["dcmha/damcha_repo"] * 200})
    fig, (bounded, free) = plt.subplots(1, 2)
    plots.kde_plot(bounded, df, "mse", "label", non_negative=True)
    plots.kde_plot(free, df, "mse", "label", non_negative=False)
    assert min(ln.get_xdata().min() for ln in bounded.get_lines()) >= 0.0
    assert min(ln.get_xdata().min() for ln in free.get_lines()) < 0.0  # an unbounded KDE would leak below 0
    styles = {ln.get_label(): ln.get_linestyle() for ln in bounded.get_lines()}
    assert styles == {"mha/paper": "-", "dcmha/damcha_repo": "--"}
    plt.close(fig)


def test_appendix_e_kdes_stay_in_each_scores_range_and_state_n(figures, tmp_path, monkeypatch):
    from attention_zoo.experiments.generation import appendix_e_kde as appendix_e_kde

    monkeypatch.setattr(appendix_e_kde, "atomic_savefig", plots.atomic_savefig)  # the fixture's keeper

    rng = np.random.default_rng(0)
    n = 64
    df = pd.DataFrame({"nll": rng.normal(2.7, 0.15, 2 * n), "bertscore_f1": rng.beta(2, 12, 2 * n),
                       "label": ["mha/paper"] * n + ["damcha/paper"] * n, "seed": [0, 1] * n})
    appendix_e_kde.kde_figure(df, "concepts", tmp_path / "kde.png", "smoke")
    fig = figures["kde.png"]
    nll, bert = fig.axes[0], fig.axes[1]
    assert nll.get_xlim()[0] > 1.5  # the axis follows the data (2.3-3.1), not the bound at 0
    assert min(ln.get_xdata().min() for ln in bert.get_lines()) >= 0.0  # F1 has no mass below 0
    assert "nats/token" in nll.get_xlabel()
    assert "n = 64 samples per curve" in fig._suptitle.get_text() and "2 seeds pooled" in fig._suptitle.get_text()
    assert all("(n = 64)" in ln.get_label() for ln in nll.get_lines())


def test_ci_table_gives_student_t_intervals():
    df = pd.DataFrame({"variant": ["mha"] * 4 + ["damcha"], "metric": ["x"] * 5, "value": [1.0, 2.0, 3.0, 4.0, 5.0]})
    ci = report.ci_table(df, ["variant"], ["metric"], floatfmt=".3f").set_index("variant")
    assert ci.loc["mha", "x"] == "2.500 [0.446, 4.554] (n=4)"  # t_{0.975,3} = 3.182, s = 1.291
    assert ci.loc["damcha", "x"] == "5.000 (n=1)"


def test_a_delta_tables_heading_calls_its_brackets_an_interval_only_from_five_seeds():
    from attention_zoo.claims.paired import interval_heading

    ranges = pd.DataFrame({"method": ["range", "range"]})
    assert "range of the seeds" in interval_heading(ranges) and "95 %" not in interval_heading(ranges)
    assert interval_heading(pd.DataFrame({"method": ["t", "t"]})) == "mean [95 % interval] (n seeds)"
    mixed = interval_heading(pd.DataFrame({"method": ["t", "range"]}))
    assert "95 % t interval from 5 seeds" in mixed and "range of the seeds" in mixed
