"""The leaderboard as markdown (GitHub-flavoured: tables and footnotes).

Layout: a title; per table (one per dataset and base model) the protocol of each run,
the sampling error of its accuracies (95 % Clopper–Pearson intervals over the n test
inputs, the widest half-width, and, on a subset of the test split, how to certify all
of it), a headline sentence (from verified-sound rows only; a leader whose paired
difference from the next rows is not significant is named as a tie), the verified-sound
rows ranked (each accuracy with its interval; a column compares each row with its
group's first by McNemar's exact test at the headline radius; where the empirical
attack ran, its robust accuracy beside each certified accuracy),
then under their own heading the memory (order-dependent) rows ranked at their worst
replayed input order with the spread over orders, then the rows whose radii are not
certified (a check found a problem, did not complete, or none ran), the plots, the failures and each run's spec; the verdict footnotes and the metric legend
close the document. All text from plugins and specs goes through
:func:`~harness.reports.leaderboard.escape.md_text`; numbers use fixed formats; nothing
depends on the time of rendering, so the same stored runs give the same bytes.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from harness.foundation.protocol import PRECISION_MEANINGS
from harness.foundation.verdict import false_alarm_statement
from harness.mathematics.significance import CONFIDENCE, SIGNIFICANCE, widest_half_width
from harness.reports.leaderboard.board import Board, Row, Table
from harness.reports.leaderboard.escape import md_code, md_fence, md_text
from harness.reports.leaderboard.metrics import (
    Metric,
    certified_key,
    has_interval,
    metric_catalog,
    sampled_in_rounds,
)
from harness.reports.leaderboard.plots import certified_plot_name, classwise_plot_name
from harness.reports.leaderboard.reproduce import spec_toml
from harness.reports.leaderboard.stated_protocol import protocol_differences, run_protocol
from harness.store.storedrun import IMPORTED, NOT_CHECKED


def fmt(metric: Metric, value: Any, interval: tuple[float, float] | None = None) -> str:
    """A cell: the value in the metric's format, with its interval when it has one."""
    if value is None:
        return "–"
    text = f"{value:.{metric.digits}f}" if metric.digits is not None else f"{value:#.3g}"
    if interval is not None and has_interval(metric.key):
        text += f" [{interval[0]:.{metric.digits}f}, {interval[1]:.{metric.digits}f}]"
    return text


def _paired(row: Row, rank: int) -> str:
    """The comparison cell: ``leader``, ``tie (p = 0.50)``, ``p = 0.003`` or ``not paired``."""
    if rank == 1:
        return "leader"
    if row.paired is None:
        return "not paired"
    p = row.paired.p_value
    return f"tie (p = {p:.2f})" if row.paired.tie else f"p = {p:.2g}"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {params[k]}" for k in sorted(params)) or "defaults"


def _arithmetic(p: dict[str, Any]) -> str:
    """``, precision bf16, channels-last, noise philox-v1`` (runs that record them); on CUDA
    what the precision computes (``tf32-conv``: PyTorch's default arithmetic)."""
    out = ""
    if "precision" in p:
        out += f", precision {md_text(p['precision'])}"
        if p.get("device") == "cuda" and p["precision"] in PRECISION_MEANINGS:
            out += f" ({PRECISION_MEANINGS[p['precision']]})"  # the harness's own text
    if p.get("channels_last"):
        out += ", channels-last"
    if "noise" in p:
        out += f", noise {md_text(p['noise'])}"
    if p.get("cudnn", "heuristic") != "heuristic":
        out += f", cuDNN {md_text(p['cudnn'])} mode"
    return out


def _fingerprint(f: dict[str, Any]) -> str:
    """The recorded arithmetic (:mod:`harness.engine.arithmetic`) in a line; a replay on the same
    one reproduces the counts bit for bit."""
    if "varied" in f:
        return "varied (resumed on another arithmetic): counts replay statistically only"
    threads = f", {f['threads']} threads" if f.get("threads") else ""
    return md_text(
        f"{f.get('device_type')} ({f.get('device_name')}{threads}, {f.get('cpu_capability')}), "
        f"torch {f.get('torch')}, {f.get('batch_size')} rows per forward pass, "
        f"{f.get('executor')} executor"
    )


def _protocol_warning(table: Table, stem: str | None) -> list[str]:
    differ = protocol_differences([run_protocol(run, stem) for run in table.runs])
    if not differ:
        return []
    what = "; ".join(f"{k}: {', '.join(md_text(v) for v in vs)}" for k, vs in differ.items())
    return [
        f"**Warning.** The runs of this table follow different protocols ({what}); "
        "their rows are ranked together but measure different things.",
        "",
    ]


def _estimation(p: dict[str, Any]) -> str:
    """The estimation samples a protocol draws: n, or sequential sampling and its cap."""
    if p.get("sampling") == "sequential":
        return f"sequential sampling up to n_max = {p['n_max']} (n = {p['n']})"
    return f"n = {p['n']}"


def _protocol_table(p: dict[str, Any]) -> list[str]:
    alpha = md_text(f"{p['alpha']:g}")
    arithmetic = _arithmetic(p)
    p = {k: md_text(v) if isinstance(v, int) else v for k, v in p.items()}  # ints from a spec
    count = "all" if p["test_count"] is None else f"at most {p['test_count']}"
    versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items())
    items = [
        ("run", f"{md_code(p['run_id'])} ({md_text(p['name'])})"),
        ("dataset", md_text(p["dataset"])),
        ("test subset", f"test points 0, k, 2k, … with k = {p['test_every']}, {count}: "
                        f"{p['inputs']} inputs"),
        ("certification", f"n0 = {p['n0']}, {_estimation(p)}, α = {alpha}, "
                          f"batch size {p['batch_size']}{arithmetic}"),
        ("base model", f"{md_text(p['architecture'])} ({md_text(_params(p['architecture_params']))})"),
        ("trainer", f"{md_text(p['trainer'])} ({md_text(_params(p['trainer_params']))})"),
        ("recipe hash", md_code(p["recipe_hash"] or "unknown")),
        *([("weights (SHA-256)", md_code(p["weights_digest"]))] if p.get("weights_digest") else []),
        *([("arithmetic", _fingerprint(p["arithmetic"]))] if p.get("arithmetic") else []),
        ("seeds", f"certification {p['seed']}, model {p['model_seed']}"),
        ("device", md_text(p["device"])),
        ("versions", md_text(versions)),
        ("git commit", md_code(p["git_commit"]) if p["git_commit"] else "unknown"),
        ("date", f"started {md_code(p['created'])}, finished "
                 + (md_code(p["finished"]) if p["finished"] else "never")),
        ("reproduce", f"{md_code(p['command'])} at that commit, with the spec below"),
    ]  # fmt: skip
    return ["| | |", "|:--|:--|", *[f"| {k} | {v} |" for k, v in items]]


def _row_name(row: Row) -> str:
    return f"{md_text(row.method)} ({md_text(row.setting)})"


def _headline(table: Table) -> str:
    radius = table.headline_radius
    key = certified_key(radius)
    if table.sound_rows:
        best = table.sound_rows[0]
        ties = [r for r in table.sound_rows[1:] if r.paired is not None and r.paired.tie]
        lo, hi = best.metrics["intervals"][key]
        if ties:
            names = ", ".join(f"{_row_name(r)} ({r.metrics[key]:.3f})" for r in ties)
            return (
                f"**Headline.** Among verified-sound rows at radius {radius:g}, no single row "
                f"leads: {_row_name(best)} has the highest certified accuracy, "
                f"{best.metrics[key]:.3f} [{lo:.3f}, {hi:.3f}] (ACR {best.metrics['acr']:.3f}), "
                f"but its difference from {names} is not significant (McNemar's exact test "
                f"on the paired inputs, p >= {SIGNIFICANCE:g}): a tie."
            )
        return (
            f"**Headline.** Among verified-sound rows, {_row_name(best)} leads at radius "
            f"{radius:g} with certified accuracy {best.metrics[key]:.3f} [{lo:.3f}, {hi:.3f}] "
            f"(ACR {best.metrics['acr']:.3f})"
            + (
                f", significantly above the next row (McNemar's exact test on the paired "
                f"inputs, p = {table.sound_rows[1].paired.p_value:.2g})."
                if len(table.sound_rows) > 1 and table.sound_rows[1].paired is not None
                else "."
            )
        )
    if table.other_rows or table.memory_rows:
        best = (table.other_rows or table.memory_rows)[0]
        return (
            f"**Headline.** No row is verified sound. Among the others, {_row_name(best)} "
            f"claims the highest certified accuracy at radius {radius:g}, "
            f"{best.metrics[key]:.3f}, which is not certified."
        )
    return "**Headline.** No method produced certificates."


class _Footnotes:
    """Numbered verdict footnotes in order of first reference."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, row: Row) -> str:
        label = f"v{len(self.lines) + 1}"
        parts = []
        for check in row.checks:
            budget = f" (budget {md_text(check.budget)})" if check.budget else ""
            flags = f" (flags: {md_text(', '.join(check.flags))})" if check.flags else ""
            summary = f", {md_text(check.summary)}" if check.summary else ""
            parts.append(
                f"{md_text(check.check)}{budget}: **{md_text(check.verdict)}**{summary}{flags}"
            )
        applied = md_text(", ".join(row.applied)) or "none"
        self.lines.append(
            f"[^{label}]: {_row_name(row)}, verdict **{md_text(row.verdict)}**; checks applied: "
            f"{applied}. " + " · ".join(parts) + "."
        )
        return f"[^{label}]"


def _spread(row: Row) -> str:
    """ACR over the replayed input orders of a memory row: min–max (median), P orders."""
    order = row.order or {}
    acr = order.get("acr")
    if not acr:
        return "–"
    return (f"{acr['min']:.3f}–{acr['max']:.3f} (median {acr['median']:.3f}, "
            f"{order.get('orders')} orders)")  # fmt: skip


def _metric_table(
    rows: list[Row], table: Table, catalog: list[Metric], notes: _Footnotes, spread: bool = False
) -> list[str]:
    with_run = len(table.runs) > 1
    versus = f"vs #1 at {table.headline_radius:g}"
    head = ["#", *(["run"] if with_run else []), "method", "setting",
            *[md_text(m.header) for m in catalog], *(["ACR over orders"] if spread else []),
            versus, "verdict"]  # fmt: skip
    align = ["--:", *([":--"] if with_run else []), ":--", ":--",
             *["--:" for _ in catalog], *([":--"] if spread else []), ":--", ":--"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for rank, row in enumerate(rows, 1):
        verdict = md_text(row.verdict)
        if row.verdict not in (NOT_CHECKED, IMPORTED):
            verdict += " " + notes.add(row)
        intervals = row.metrics.get("intervals", {})
        cells = [str(rank), *([md_code(row.run_id[:12])] if with_run else []),
                 md_text(row.method), md_text(row.setting),
                 *[fmt(m, row.metrics.get(m.key), intervals.get(m.key)) for m in catalog],
                 *([_spread(row)] if spread else []), _paired(row, rank), verdict]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _sampling_error(table: Table, stem: str | None) -> list[str]:
    """What the intervals mean on this table, and how to certify the whole test split."""
    runs = [run for run in table.runs if not run.imported]
    sizes = sorted({row.metrics["inputs"] for row in table.rows if row.run_id in
                    {run.run_id for run in runs}})  # fmt: skip
    if not sizes:
        return []
    widest = ", ".join(f"±{widest_half_width(n):.3f} with {n} inputs" for n in sizes)
    out = (
        f"**Sampling error.** Each accuracy carries its {CONFIDENCE:.0%} Clopper–Pearson "
        f"interval over the test inputs, [low, high]; the widest (at accuracy 0.5) is {widest}. "
        "Rows are compared paired (same inputs, same model) with the first row of their group "
        f"by McNemar's exact test at radius {table.headline_radius:g}: `tie` marks a "
        f"difference that is not significant (p >= {SIGNIFICANCE:g})."
    )
    subset = [run for run in runs if run.config["dataset"].get("test_every", 1) != 1
              or run.config["dataset"].get("test_count") is not None]  # fmt: skip
    if subset:
        spec = run_protocol(subset[0], stem)["spec_file"]
        out += (
            " This board certifies a subset of the test split; the whole split: "
            + md_code(
                f"idrs-bench run {spec} --set dataset.test_every=1 --set dataset.test_count=all"
            )
            + " (its intervals shrink as 1/√n)."
        )
    return [out, ""]


def _sequential_note(table: Table) -> list[str]:
    """What a sequential run's rows measure: the same certificates at a data-dependent n."""
    runs = [run.run_id[:12] for run in table.runs if sampled_in_rounds([run])]
    if not runs:
        return []
    return [
        f"Sequential sampling (run {', '.join(md_code(r) for r in runs)}): each input's "
        "estimation samples are drawn in rounds and stop once its place on the radius grid "
        "is decided (harness/mathematics/sequential.py: a beta-binomial mixture confidence "
        "sequence with a Clopper–Pearson bound at n_max, valid at the data-dependent stopping time, so each certificate "
        "holds at the same α as a fixed-n one). Certified accuracy at the grid radii is "
        "comparable with a fixed-n run's; the ACR falls by design, since an input stops once "
        "its grid place is decided instead of tightening its radius further (Sun et al., "
        "ICLR 2025, on what ACR rewards). `samples` and `max samples` give the estimation "
        "samples behind each certificate.",
        "",
    ]


def _table_section(table: Table, stem: str | None, notes: _Footnotes) -> list[str]:
    catalog = metric_catalog(
        table.radii, any(row.attack for row in table.rows), sampled_in_rounds(table.runs)
    )
    title = f"{md_text(table.dataset)} · {md_text(table.architecture)} · model {md_code(table.recipe_hash[:12])}"
    out = [f"## {table.index}. {title}", ""]
    for run in table.runs:
        p = run_protocol(run, stem)
        out += [f"### Protocol of run {md_code(run.run_id[:12])}", "", *_protocol_table(p), ""]
    out += _protocol_warning(table, stem)
    out += _sampling_error(table, stem)
    out += _sequential_note(table)
    out += [_headline(table), ""]
    out += ["### Verified sound", ""]
    if table.sound_rows:
        out += [*_metric_table(table.sound_rows, table, catalog, notes), ""]
    else:
        out += ["No row of this table is verified sound.", ""]
    if table.memory_rows:
        out += [
            "### Order-dependent: memory certificates",
            "",
            "These rows certify through a memory of earlier inputs (Alfarra et al. 2022, App. C): "
            "their radii depend on the order of the inputs and certify no fixed classifier "
            "(Súkeník et al. 2022, App. C.2), so they are never verified sound. They are scored "
            "at the worst input order their check replayed; the spread column gives the ACR over "
            "all replayed orders.",
            "",
            *_metric_table(table.memory_rows, table, catalog, notes, spread=True),
            "",
        ]
    out += [
        "### Not verified sound: these radii are not certified",
        "",
        "A soundness check found a problem with these rows, did not complete, or none has run, "
        "so their radii are claims, not certificates.",
        "",
    ]
    if table.other_rows:
        out += [*_metric_table(table.other_rows, table, catalog, notes), ""]
    else:
        out += ["None.", ""]
    if table.imported_rows:
        out += [
            "### Imported from published logs: claims without evidence",
            "",
            "These radii were read from certification logs (`idrs-bench import-log`); no class "
            "counts came with them, so nothing here is checked or certified.",
            "",
            *_metric_table(table.imported_rows, table, catalog, notes),
            "",
        ]
    if stem is not None and table.rows:
        certified = quote(certified_plot_name(stem, table))
        classwise = quote(classwise_plot_name(stem, table))
        out += [
            f"![certified accuracy vs radius, table {table.index}]({certified})",
            "",
            f"![class-wise accuracy, table {table.index}]({classwise})",
            "",
        ]
    if table.failures:
        out += ["### Failures", ""]
        for f in table.failures:
            first = f["error"].splitlines()[0] if f["error"] else ""
            out.append(f"- {md_text(f['method'])} ({md_text(f['setting'])}): {md_text(first)}")
        out.append("")
    for run in table.runs:
        text = spec_toml(run.run["config"])
        fence = md_fence(text)
        name = run_protocol(run, stem)["spec_file"]
        out += [f"### Spec of run {md_code(run.run_id[:12])} ({md_text(name)})", "",
                f"{fence}toml", text.rstrip("\n"), fence, ""]  # fmt: skip
    return out


def _legend(board: Board) -> list[str]:
    radii = sorted({r for t in board.tables for r in t.radii})
    attacks = [row.attack for t in board.tables for row in t.rows if row.attack]
    out = ["## Columns", ""]
    for metric in metric_catalog(radii, bool(attacks), sampled_in_rounds(board.runs)):
        direction = {True: "higher is better", False: "lower is better", None: "descriptive"}[
            metric.higher_is_better
        ]
        out.append(f"- **{md_text(metric.header)}**: {md_text(metric.description)} ({direction}).")
    out.append(
        f"- **[low, high]**: the {CONFIDENCE:.0%} Clopper–Pearson interval of an accuracy over "
        "the row's test inputs (sampling error of the test subset; each certificate's own "
        "Monte Carlo error is in its α)."
    )
    out.append(
        "- **vs #1**: the row against the first row of its group on the same inputs, "
        "McNemar's exact test of certified accuracy at the headline radius; `tie`: not "
        f"significant (p >= {SIGNIFICANCE:g}); `not paired`: other inputs."
    )
    from harness.audit.empirical import AttackStrength

    for strength in sorted({tuple(sorted(a["strength"].items())) for a in attacks}):
        text = AttackStrength(**dict(strength)).statement()
        out.append(f"- **emp** attack: {md_text(text)}.")
    if any(a.get("classifier") for a in attacks):
        out.append(
            "- **emp** of a memory row: the attack targets the classifier its memory certifies "
            "through (its σ(x), no memory): with a memory, the answer at a point depends on the "
            "inputs before it, so no fixed classifier exists to attack."
        )
    out += [
        "- **verdict**: the worst verdict of the soundness checks of the row (footnote: the "
        "checks that applied, each check's verdict and summary); `not-verified` when a check "
        "that applied did not complete (`error`); only `sound` rows are ranked as certified, "
        "`order-dependent` (memory) rows apart, at their worst replayed input order.",
        "",
    ]
    return out


def _how_to_check(stem: str | None) -> str:
    """How anyone re-checks the board from its own files."""
    name = md_text(stem or "BOARD")
    return (
        f"Re-check it: `idrs-bench leaderboard --verify {name}.md` re-derives every certificate "
        f"and the verdicts from the evidence in `{name}.run.json` and re-renders the board; "
        f"`idrs-bench leaderboard --verify {name}.md --replay K` also re-draws K random inputs "
        "of every row from the files shipped beside it (the base model's weights, "
        f"`{name}.weights.pt`, and the methods' trained parts), bit for bit on the run's "
        "arithmetic and by a statistical replication test elsewhere."
    )


def render_markdown(board: Board, stem: str | None) -> str:
    """The board as markdown; ``stem`` names the plot and spec files (None: no plots)."""
    notes = _Footnotes()
    out = [
        f"# Leaderboard: {md_text(board.title)}",
        "",
        "Rendered by `idrs-bench leaderboard` from the stored run(s) "
        + ", ".join(md_code(run.run_id[:12]) for run in board.runs)
        + ". "
        + _how_to_check(stem),
        "",
    ]
    for table in board.tables:
        out += _table_section(table, stem, notes)
    out += _legend(board)
    applied = [row.applied for table in board.tables for row in table.rows]
    out += [
        "**What sound asserts, and false alarms.** " + md_text(false_alarm_statement(applied)),
        "",
    ]
    if notes.lines:
        out += [*notes.lines, ""]
    return "\n".join(out).rstrip("\n") + "\n"
