"""``results/README.md``: one page with a section per table and figure of the paper ("Table N", "Figure N",
"Appendix X", the RowSum analysis, the benchmark), each naming its script, command, wall and CPU time, files,
paper | ours | delta rows and figures; then how the results were made (command, commit, machine, per-script and
total time, from ``run_all.json``), the flavour each baseline ran in, the environment records and the known
discrepancies. Outputs a section expects but cannot find are listed as missing."""

from __future__ import annotations

import glob
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..claims import verdict_frame, verdict_markdown, verdicts_for
from ..io import atomic_write_csv, atomic_write_text, read_jsonl
from ..registry import get_attention_spec, list_attentions
from .fingerprint_records import compute_pending
from .freshness import driver_entry, freshness_line, probes_to_run, read_env_record, sittings
from .protocol import EXPERIMENTS
from .results_index_notes import DISCREPANCIES, ROWSUM, baseline_flavours, paper_blocks, rowsum_numbers
from .results_index_papers import PAPER_SECTIONS, capability_summary
from .results_summary import summary_section

RUN_RECORD = "run_all.json"  # written by run_all: runs (command, commit, machine) and per-script timings


@dataclass(frozen=True)
class Section:
    """One section of the report: what the paper calls it, the script and folder that make it, its markdown table
    and the figures it must have (globs relative to the folder)."""

    name: str  # "Table 1", "Figure 12", "Appendix E", ...
    title: str
    script: str  # run_all's name for the script; the folder under results/
    md: str
    figures: tuple[str, ...]
    figures_note: str = ""  # when the figures need more than the default run
    claims: tuple[str, ...] = ()  # ids of the claims its rows decide (their verdicts are listed in the section)
    optional: bool = False  # made by another all.py preset (decide): "not run" when absent, never "missing"
    about: str = ""  # what the section's stand-ins are and where they stop (the baselines' papers)
    made_by: str = "python reproduce/all.py --preset decide"  # the command that makes an optional section


SECTIONS = (
    Section("Table 1", "decoder-only generation", "table1_generation", "table1_generation.md",
            ("table1_generation_delta.png",), claims=("T1.", "E.kde")),
    Section("Table 2", "efficiency: memory, latency, FLOPs, parameters", "table2_efficiency",
            "table2_efficiency.md", ("table2_efficiency_memory_*.png", "table2_efficiency_latency_*.png",
                                     "table2_efficiency_gflops_*.png"), claims=("T2.",)),
    Section("Table 3", "generator depth × block ablation", "table3_depth_blocks", "table3_depth_blocks.md",
            ("table3_depth_blocks.png",), claims=("T3.",)),
    Section("Table 4", "input adaptivity × sharing ablation", "table4_ablation", "table4_ablation.md",
            ("table4_ablation.png",), claims=("T4.",)),
    Section("Table 5", "character-level GPT-2 pretraining", "table5_gpt2", "table5_gpt2.md",
            ("table5_gpt2_delta.png", "table5_gpt2_delta_curve_*.png"), claims=("T5.",)),
    Section("Table 6", "ViT classification", "table6_vit", "table6_vit.md", ("table6_vit_delta*.png",),
            claims=("T6.",)),
    Section("Table 7", "complexity and measured scaling", "table7_complexity", "table7_complexity.md",
            ("table7_complexity_*_vs_seq_len.png", "table7_complexity_*_vs_d_model.png"),
            claims=("T7.", "D3.", "D4.")),
    Section("Figure 12", "synthetic regression, R² and gain vs λ (smoke preset)", "synthetic", "synthetic.md",
            ("figure12_r2.png", "figure12_gain.png"), claims=("I.lambda", "I.not_params")),
    Section("Figure 13", "synthetic classification, accuracy vs d_e (smoke preset)", "synthetic", "synthetic.md",
            ("figure13_accuracy.png", "figure13_gain.png"), claims=("I.de_",)),
    Section("Figure 12 (decide)", "synthetic regression tuned, early stopping on validation, with controls",
            "synthetic_decide",
            "synthetic.md", ("figure12_r2.png", "figure12_gain.png", "synthetic_budget_gain_regression.png",
                             "synthetic_learning_loss.png"), claims=("I.lambda", "I.not_params"), optional=True),
    Section("Figure 13 (decide)", "synthetic classification tuned, early stopping on validation, with controls",
            "synthetic_decide",
            "synthetic.md", ("figure13_accuracy.png", "figure13_gain.png",
                             "synthetic_budget_gain_classification.png"), claims=("I.de_",), optional=True),
    Section("Table 1 (decide)", "generation, every arm tuned, early stopping on validation", "table1_decide",
            "table1_generation.md", ("table1_generation_delta.png",), claims=("T1.",), optional=True),
    Section("Table 3 (decide)", "generator depth × block ablation, tuned, early stopping on validation",
            "table3_decide",
            "table3_depth_blocks.md", ("table3_depth_blocks.png",), claims=("T3.",), optional=True),
    Section("Table 4 (decide)", "input adaptivity × sharing ablation, tuned, early stopping on validation",
            "table4_decide",
            "table4_ablation.md", ("table4_ablation.png",), claims=("T4.",), optional=True),
    Section("Table 5 (decide)", "character-level LM, every arm tuned, early stopping on validation", "table5_decide",
            "table5_gpt2.md", ("table5_gpt2_delta.png",), claims=("T5.",), optional=True),
    Section("Table 6 (decide)", "digits ViT, every arm tuned, early stopping on validation", "table6_decide",
            "table6_vit.md", ("table6_vit_delta*.png",), claims=("T6.",), optional=True),
    Section("Appendix E", "distributions of per-sample scores (KDEs)", "appendix_e_kde", "appendix_e_kde.md",
            ("appendix_e_kde_*.png",), claims=("E.",)),
    Section("Appendix F", "evolution of DAMCHA's metric during training", "appendix_fgh", "appendix_fgh.md",
            ("appF_adaptive_step*.png", "appF_unshared_step*.png"), claims=("F.",)),
    Section("Appendix G", "block-wise gradient flow with and without sharing", "appendix_fgh", "appendix_fgh.md",
            ("appG_grad_adaptive.png", "appG_grad_unshared.png"), claims=("G.",)),
    Section("Appendix H", "static (w/o f(x)) vs adaptive metric", "appendix_fgh", "appendix_fgh.md",
            ("appF_static_step*.png",), claims=("H.",)),
    Section("RowSum analysis", "DAMCHA under RowSum", "rowsum_analysis", "rowsum_analysis.md",
            ("diag_vs_full_over_H.png", "block_inference_losses.png"),
            "the figures come from the `diag_vs_full` section"),
    Section("Benchmark", "quick benchmark and training throughput", "benchmark", "benchmark.md",
            ("benchmark.png", "benchmark_memory.png")),
    *(Section(name, title, folder, md, (), claims=claims, optional=True, about=about)
      for name, title, folder, md, claims, about in PAPER_SECTIONS),
    Section("Scale axis", "compute multipliers on a char-LM ladder (smoke preset)", "scaling", "scaling.md",
            ("scaling_loss_vs_compute.png", "scaling_multipliers.png"), claims=("S.", "DC.compute")),
    Section("Scale axis (decide)", "compute multipliers on the char-LM ladder, every arm tuned per rung",
            "scaling_decide", "scaling.md", ("scaling_loss_vs_compute.png", "scaling_multipliers.png"),
            claims=("S.", "DC.compute", "T5."), optional=True,
            made_by="python reproduce/scaling.py --preset decide --out results/scaling_decide"),
)


def section_files(results: str | Path, sec: Section) -> tuple[Path | None, list[Path], list[str]]:
    """(its markdown if present, its figures found, the figure globs without a match)."""
    folder = Path(results) / sec.script
    md = folder / sec.md
    figs, missing = [], []
    for pattern in sec.figures:
        hits = sorted(Path(h) for h in glob.glob(str(folder / pattern)))
        figs += [h for h in hits if h not in figs]
        if not hits:
            missing.append(pattern)
    return (md if md.is_file() else None), figs, missing


def missing_outputs(results: str | Path) -> list[str]:
    """Every expected markdown table and figure of SECTIONS that is not under ``results`` (as "section: what");
    an optional section (another preset's) counts only once its folder exists."""
    out = []
    for sec in SECTIONS:
        if sec.optional and not (Path(results) / sec.script).is_dir():
            continue
        md, _, missing = section_files(results, sec)
        if md is None:
            out.append(f"{sec.name}: {sec.script}/{sec.md}")
        out += [f"{sec.name}: {sec.script}/{m}" for m in missing]
    return out


def load_run_record(results: str | Path) -> dict:
    try:
        rec = json.loads((Path(results) / RUN_RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _fmt_s(v) -> str:
    if v is None:
        return "–"
    v = float(v)
    return f"{v:.0f} s" if v < 120 else f"{v:.0f} s ({v / 60:.1f} min)"


def _how_made(record: dict, results: Path) -> list[str]:
    """The command, commit, machine and timings of the run(s) recorded by run_all."""
    runs, scripts = record.get("runs") or [], record.get("scripts") or {}
    if not runs:
        return ["_No `run_all.json`: these results were not produced by `python reproduce/all.py` (each table's "
                "`.env.json` says how it was made)._", ""]
    last = runs[-1]
    used = {s.get("run_id") for s in scripts.values()}
    shown = [r for r in runs if r.get("run_id") in used] or [last]
    out = []
    if len(shown) > 1:
        out += [f"**Mixed runs: the scripts below come from {len(shown)} runs of `reproduce/all.py`** (see the "
                "`run` column).", ""]
    for r in shown:
        dirty = f" **({_tree(r)})**" if r.get("git_dirty") else f" ({_tree(r)})"
        out += [f"- run `{r.get('run_id')}`: `{r.get('command')}` (preset `{r.get('preset')}`)",
                f"  - commit `{r.get('git_commit')}`{dirty}, started {r.get('time_utc')}",
                f"  - machine: host `{r.get('host')}`, {r.get('cpu_model')}, {r.get('cores')} cores; device "
                f"{r.get('device_name')} ({r.get('device')}); torch {r.get('torch')}, Python {r.get('python')}",
                f"  - whole run: {_fmt_s(r.get('total_wall_s'))} wall, {_fmt_s(r.get('total_cpu_s'))} CPU "
                f"(all processes); 1-min load average {r.get('loadavg_start', float('nan')):.1f} at the start, "
                f"{r.get('loadavg_end', float('nan')):.1f} at the end"]
        if (r.get("loadavg_start") or 0) > 0.5:
            out.append("  - **the machine was not idle when the run started** (load average > 0.5): timings may "
                       "be inflated; the noise guard marks affected latencies")
    out += ["", "| section(s) | script | wall | CPU | exit | load start → end | run |", "|---|---|---|---|---|---|---|"]
    superseded = {name for name in scripts if driver_entry(results / name, record, name) is None}
    for name, rec in scripts.items():
        secs = ", ".join(s.name for s in SECTIONS if s.script == name) or name
        old = " (superseded: its folder was remade outside `all.py`, below)" if name in superseded else ""
        out.append(f"| {secs} | `{name}` | {_fmt_s(rec.get('wall_s'))} | {_fmt_s(rec.get('cpu_s'))} | "
                   f"{rec.get('exit_code')} | {rec.get('loadavg_start', 0):.1f} → {rec.get('loadavg_end', 0):.1f} | "
                   f"`{rec.get('run_id')}`{old} |")
    out += ["", "Commands (in run order):", ""]
    out += [f"- `{name}`: `{rec.get('command')}`" for name, rec in scripts.items()]
    return out + [""] + _direct_runs(record, results) + _resumed_stores(results)


def _sittings_text(runs: list[dict]) -> str:
    return "; ".join(f"`{s.get('command')}` at `{str(s.get('git_commit'))[:7]}` ({_tree(s)}), started "
                     f"{s.get('time_utc')}" for s in runs)


def _tree(env: dict) -> str:
    """Whether a run's working tree was clean, from its record (``git_dirty``); older records may not say."""
    return "tree unknown" if env.get("git_dirty") is None else "dirty tree" if env["git_dirty"] else "clean tree"


def _direct_runs(record: dict, results: Path) -> list[str]:
    """Section folders whose store was made by running its script directly, not through ``all.py`` (no driver
    timing applies to them: each cell's own training time is in its rows)."""
    out = []
    for script in dict.fromkeys(sec.script for sec in SECTIONS):
        folder = results / script
        runs = sittings(folder)
        if runs and driver_entry(folder, record, script) is None:
            out.append(f"- `{script}/`: {_sittings_text(runs)}")
    if not out:
        return []
    return ["**Made outside `all.py`**: these folders' stores were made by running their script directly (in "
            "sittings, each named by its command, commit and start); `run_all.json` has no timing of them.", "",
            *out, ""]


def _resumed_stores(results: Path) -> list[str]:
    """Stores whose finished cells come from more than one run of their script (a run stopped and resumed): the
    wall time above is the last sitting's, so say which run measured how many cells."""
    out = []
    for path in sorted(results.glob("*/*.jsonl")):
        envs, owner, contexts = {}, {}, {}
        for rec in read_jsonl(path):
            if rec.get("kind") == "run":
                envs[rec.get("run_id")] = rec.get("env") if isinstance(rec.get("env"), dict) else {}
            elif "cell_id" in rec:
                owner[rec["cell_id"]] = rec.get("run_id")  # the newest record of a cell counts, as in the store
                contexts[rec["cell_id"]] = rec.get("context_id")
        for ctx in dict.fromkeys(contexts.values()):
            counts = Counter(owner[c] for c, x in contexts.items() if x == ctx)
            if len(counts) < 2:
                continue
            parts = [f"{n} by `{rid}` (commit `{str(env.get('git_commit'))[:7]}`, {_tree(env)}, "
                     f"{env.get('cpu_model')}, started {env.get('time_utc')})" for rid, n in counts.items()
                     for env in [envs.get(rid, {})]]
            out.append(f"- `{path.relative_to(results)}`: {sum(counts.values())} cells from {len(counts)} runs of "
                       f"its script: " + "; ".join(parts))
    if not out:
        return []
    return ["**Resumed stores**: these stores' cells were measured by more than one sitting (a run stopped and "
            "resumed; finished cells are never redone), so the wall time above counts the last sitting only; each "
            "cell's own CPU time is in its rows.", "", *out, ""]


def section_modules(sec: Section) -> tuple[str, ...]:
    """The modules whose code makes a section's numbers (``freshness``)."""
    if sec.script == "benchmark":
        return ("attention_zoo.measure.quick", EXPERIMENTS["synthetic"].module_path.rpartition(".")[0]
                + ".train_speed")
    name = sec.script.removesuffix("_decide")
    if name not in EXPERIMENTS:  # a decide folder named by its table: table5_decide -> table5_gpt2
        name = next((k for k in EXPERIMENTS if k.startswith(name + "_")), name)
    return (EXPERIMENTS[name].module_path,) if name in EXPERIMENTS else ()


def _section_lines(results: Path, sec: Section, record: dict, seen_md: set, verdicts: list,
                   probes: bool = True) -> list[str]:
    md, figs, missing = section_files(results, sec)
    out = [f"## {sec.name}: {sec.title}", ""] + ([sec.about, ""] if sec.about else [])
    folder = results / sec.script
    preset = "decide" if sec.optional else None
    mine = [v for v in verdicts if v.claim.id.startswith(sec.claims) and (preset is None and v.preset != "decide"
                                                                           or v.preset == preset
                                                                           or sec.about and v.preset == "any")
            ] if sec.claims else []
    verdict_lines = ["Verdicts (details in the table at the top):", ""] + [
        f"- `{v.claim.id}` [{v.preset}]: **{v.verdict}** — {v.ours}" for v in mine] + [""] if mine else []
    if sec.optional and not folder.is_dir():  # a paper's section still lists the verdicts other stores or formulas give
        return out + [f"Not run: made by `{sec.made_by}` (folder `{sec.script}/`).", "",
                      *(verdict_lines if sec.about else [])]
    if section_modules(sec):
        out += [freshness_line(folder, record, sec.script, section_modules(sec), probes=probes,
                               cache_dir=results / "_cache" / "fingerprints"), ""]
    rec = driver_entry(folder, record, sec.script)
    if rec:
        out.append(f"Script `{sec.script}`: {_fmt_s(rec.get('wall_s'))} wall, {_fmt_s(rec.get('cpu_s'))} CPU, "
                   f"exit {rec.get('exit_code')}; `{rec.get('command')}`")
    elif runs := sittings(folder):
        out.append(f"Script `{sec.script}`: made outside `all.py`, in sittings: {_sittings_text(runs)}.")
    else:
        out.append(f"Script `{sec.script}`: not in the run record (`run_all.json`).")
    for env_file in sorted(folder.glob("*.env.json")):
        if (why := read_env_record(env_file)[1]):
            out.append(f"**Unreadable environment record:** `{sec.script}/{env_file.name}` is {why}; the run it "
                       "describes is not counted above (its commit and times are unknown).")
    out.append("")
    if md is not None:
        files = [md] + sorted(folder.glob("*_long.csv")) + sorted(folder.glob("*_wide.csv")) + \
            sorted(p for p in folder.glob("*.csv") if not p.name.endswith(("_long.csv", "_wide.csv")))
        out.append("Files: " + ", ".join(f"[{f.name}]({sec.script}/{f.name})" for f in files))
        out.append("")
    out += verdict_lines
    if md is not None and md not in seen_md:  # Figures 12 and 13 share synthetic.md: its paper rows show once
        for block in paper_blocks(md.read_text()):
            out += [block, ""]
        seen_md.add(md)
    for f in figs:
        rel = f.relative_to(results)
        out += [f"![{rel}]({rel})", ""]
    if sec.script == "benchmark" and (folder / "train_speed.md").is_file():
        body = (folder / "train_speed.md").read_text().split("\n", 2)[-1]
        out += ["### Training throughput of the synthetic cells", "", body, ""]
    lost = ([f"`{sec.script}/{sec.md}`"] if md is None else []) + [f"`{sec.script}/{m}`" for m in missing]
    if lost:
        note = f" ({sec.figures_note})" if sec.figures_note and missing else ""
        out += [f"**Missing:** {', '.join(lost)}{note}.", ""]
    return out


COMPUTED = ("Every number is measured by the script that wrote it, except these, which are computed from closed "
            "forms: the authors' GFLOPs formula (Table 2, `paper_model_gflops`), the analytic FLOP columns "
            "(`*_analytic`, `train_flops`, `train_gflops`), Table 7's complexity formulas and its parameter counts "
            "under the readings of P, and the verdicts marked `computed`. Units, device, preset and n are in each "
            "table and its `.env.json`.")


def _newest_completing_run(record: dict) -> dict | None:
    """The newest all.py run that completed at least one section (exit 0) -- the one the report's first line names;
    an interrupted run's record is still in "How these results were made". Falls back to the newest run."""
    runs = record.get("runs") or []
    done = {v.get("run_id") for v in (record.get("scripts") or {}).values() if v.get("exit_code") == 0}
    completing = [r for r in runs if r.get("run_id") in done]
    return (completing or runs or [None])[-1]


def build_index(results: str | Path, preset: str | None = None, probes: bool = True) -> Path:
    """Write ``<results>/README.md`` from the files under ``results`` and ``run_all.json``. ``probes=False``: a
    section whose code changed is called older without recomputing its fingerprints (a quick rebuild)."""
    results = Path(results)
    record = load_run_record(results)
    run = _newest_completing_run(record)
    preset = preset or (run.get("preset") if run else "smoke")
    command = run.get("command") if run else f"python reproduce/all.py --preset {preset}"
    verdicts = verdicts_for(results)
    atomic_write_text(results / "claims.md", "# Verdicts on the paper's claims\n\n" + verdict_markdown(verdicts))
    atomic_write_csv(verdict_frame(verdicts), results / "claims.csv")
    out = ["# Reproduction report", "", f"Generated by `{command}` and rebuilt from the stores by "
           "`python reproduce/all.py --index-only`. " + COMPUTED + " Sections: "
           + ", ".join(f"[{s.name}](#{_anchor(s)})" for s in SECTIONS) + ".", "",
           *summary_section(results, verdicts),
           "## Verdicts on the paper's claims", "", verdict_markdown(verdicts),
           "Also as [claims.md](claims.md) and [claims.csv](claims.csv) (with the context and runs behind each "
           "verdict); one paper's: `python -m attention_zoo.claims --paper tha|dcmha|colmha|moa|mma|damcha`.", "",
           *capability_summary(results)]
    out += ["## How these results were made", ""] + _how_made(record, results)
    if probes:  # the sections whose code changed: their probes computed up front, two processes at a time
        compute_pending([job for sec in SECTIONS if section_modules(sec) and (results / sec.script).is_dir()
                         for job in probes_to_run(results / sec.script, record, sec.script, section_modules(sec),
                                                  results / "_cache" / "fingerprints")])
    seen_md: set[Path] = set()
    for sec in SECTIONS:
        out += _section_lines(results, sec, record, seen_md, verdicts, probes)
        if sec.script == "rowsum_analysis":
            out += ["### DAMCHA under RowSum", "", ROWSUM, rowsum_numbers(results)]
    known = {s.script for s in SECTIONS}
    flavours: dict[str, set[str]] = {}
    others = []
    for sub in sorted(p for p in results.iterdir() if p.is_dir()):
        for csv in sub.glob("*_long.csv"):
            for v, fl in baseline_flavours(csv).items():
                flavours.setdefault(v, set()).update(fl)
        if sub.name in known:
            continue
        mds = sorted(sub.glob("*.md"))
        pngs = sorted(sub.rglob("*.png"))
        if not mds and not pngs:
            continue
        others += [f"### {sub.name}", ""]
        for md in mds:
            others.append(f"- [{md.name}]({sub.name}/{md.name})")
            for block in paper_blocks(md.read_text()):
                others += ["", block]
        others += [f"- [{p.relative_to(results)}]({p.relative_to(results)})" for p in pngs]
        others.append("")
    if others:
        out += ["## Other outputs", ""] + others
    out += ["## Baseline flavours", "", "| variant | flavours available | flavours in these results |", "|---|---|---|"]
    for name in list_attentions():
        ran = ", ".join(sorted(flavours.get(name, set()))) or "–"
        out.append(f"| {name} | {', '.join(get_attention_spec(name).flavors)} | {ran} |")
    out += ["", "## Environment records", ""]
    for env in sorted(results.rglob("*.env.json")):
        rec, why = read_env_record(env)
        if rec is None:
            out.append(f"- `{env.relative_to(results)}`: unreadable ({why})")
            continue
        dirty = f" ({_tree(rec)})"
        out.append(f"- `{env.relative_to(results)}`: {rec.get('device_name')} ({rec.get('device')}), torch "
                   f"{rec.get('torch')}, threads {rec.get('torch_threads')}, git {str(rec.get('git_commit'))[:10]}"
                   f"{dirty}, {rec.get('time_utc')}, `{rec.get('command')}`")
    out += ["", "## Known discrepancies between the paper, the authors' code and this harness", "", DISCREPANCIES]
    return atomic_write_text(results / "README.md", "\n".join(out))


def _anchor(sec: Section) -> str:
    """GitHub's anchor of the section heading "<name>: <title>"."""
    text = f"{sec.name}: {sec.title}".lower()
    return "".join(c for c in text.replace(" ", "-") if c.isalnum() or c in "-_")
