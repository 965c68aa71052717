"""The leaderboard as markdown (GitHub-flavoured: tables and footnotes).

Layout, results first: a title and how to re-check the board; per table (one per
dataset and base model) a warning when its runs follow different protocols, a headline
sentence (from verified-sound rows only; a leader whose paired difference from the next
rows is not significant is named as a tie), then the ranking tables with the columns a
reader compares (clean accuracy, certified accuracy at each radius with its 95 %
Clopper–Pearson interval, ACR, the paired test against the group's first row by
McNemar's exact test at the headline radius, the verdict): the verified-sound rows, the
memory (order-dependent) rows at their worst replayed input order with the spread over
orders, the rows whose radii are not certified (a check found a problem, did not
complete, or none ran), the rows imported from published logs; the certified-accuracy
plot; the sampling error of the accuracies (the widest half-width and, on a subset of
the test split, how to certify all of it); then the rest of every row in tables of
their own (the empirical attack's robust accuracy; abstention, misclassification,
class-wise accuracy, σ, time), the class-wise plot, the failures, the protocol and spec
of each run. The metric legend, what `sound` asserts and the verdict footnotes close the
document. All text from plugins and specs goes through
:func:`~harness.reports.leaderboard.escape.md_text`; numbers use fixed formats; nothing
depends on the time of rendering, so the same stored runs give the same bytes.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from harness.foundation.verdict import false_alarm_statement
from harness.mathematics.significance import CONFIDENCE, SIGNIFICANCE, widest_half_width
from harness.reports.leaderboard.board import Board, Row, Table
from harness.reports.leaderboard.escape import md_code, md_fence, md_text
from harness.reports.leaderboard.metrics import (
    CERTIFIED,
    EMPIRICAL,
    Metric,
    certified_key,
    empirical_key,
    has_interval,
    metric_catalog,
    sampled_in_rounds,
)
from harness.reports.leaderboard.plots import certified_plot_name, classwise_plot_name
from harness.reports.leaderboard.protocol_markdown import protocol_table, protocol_warning
from harness.reports.leaderboard.reproduce import spec_toml
from harness.reports.leaderboard.stated_protocol import run_protocol
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


def _identity(row: Row, with_run: bool) -> list[str]:
    return [*([md_code(row.run_id[:12])] if with_run else []), md_text(row.method),
            md_text(row.setting)]  # fmt: skip


def _ranking_table(
    rows: list[Row], table: Table, catalog: list[Metric], notes: _Footnotes, spread: bool = False
) -> list[str]:
    """A group's rows ranked, with the columns a reader compares (the ``main`` metrics)."""
    main = [m for m in catalog if m.table == "main"]
    with_run = len(table.runs) > 1
    versus = f"vs #1 at {table.headline_radius:g}"
    head = ["#", *(["run"] if with_run else []), "method", "setting",
            *[md_text(m.header) for m in main], *(["ACR over orders"] if spread else []),
            versus, "verdict"]  # fmt: skip
    align = ["--:", *([":--"] if with_run else []), ":--", ":--",
             *["--:" for _ in main], *([":--"] if spread else []), ":--", ":--"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for rank, row in enumerate(rows, 1):
        verdict = md_text(row.verdict)
        if row.verdict not in (NOT_CHECKED, IMPORTED):
            verdict += " " + notes.add(row)
        intervals = row.metrics.get("intervals", {})
        cells = [str(rank), *_identity(row, with_run),
                 *[fmt(m, row.metrics.get(m.key), intervals.get(m.key)) for m in main],
                 *([_spread(row)] if spread else []), _paired(row, rank), verdict]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _detail_table(table: Table, metrics: list[Metric]) -> list[str]:
    """Every row of ``table`` in board order, with ``metrics`` as columns."""
    with_run = len(table.runs) > 1
    head = [*(["run"] if with_run else []), "method", "setting",
            *[md_text(m.header) for m in metrics]]  # fmt: skip
    align = [*([":--"] if with_run else []), ":--", ":--", *["--:" for _ in metrics]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for row in table.rows:
        intervals = row.metrics.get("intervals", {})
        cells = [*_identity(row, with_run),
                 *[fmt(m, row.metrics.get(m.key), intervals.get(m.key)) for m in metrics]]  # fmt: skip
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
    out += protocol_warning(table, stem)
    out += [_headline(table), ""]
    out += _sequential_note(table)
    out += ["### Verified sound", ""]
    if table.sound_rows:
        out += [*_ranking_table(table.sound_rows, table, catalog, notes), ""]
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
            *_ranking_table(table.memory_rows, table, catalog, notes, spread=True),
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
        out += [*_ranking_table(table.other_rows, table, catalog, notes), ""]
    else:
        out += ["None.", ""]
    if table.imported_rows:
        out += [
            "### Imported from published logs: claims without evidence",
            "",
            "These radii were read from certification logs (`idrs-bench import-log`); no class "
            "counts came with them, so nothing here is checked or certified.",
            "",
            *_ranking_table(table.imported_rows, table, catalog, notes),
            "",
        ]
    if stem is not None and table.rows:
        certified = quote(certified_plot_name(stem, table))
        out += [f"![certified accuracy vs radius, table {table.index}]({certified})", ""]
    out += _sampling_error(table, stem)
    attack = [m for m in catalog if m.table == "attack"]
    if attack and table.rows:
        out += ["### Attack: empirical robust accuracy", "",
                "The inputs the smoothed classifier answers right (PREDICT, as clean accuracy "
                "counts them) that a PGD attack on it did not break within each radius: an "
                "upper bound on robust accuracy, not a certificate, and at most the clean "
                "accuracy (an input misclassified or abstained on is robust at no radius).", "",
                *_detail_table(table, attack), "", *_beyond_attack(table)]  # fmt: skip
    if table.rows:
        out += ["### Every row: abstention, class-wise accuracy, σ and time", "",
                *_detail_table(table, [m for m in catalog if m.table == "details"]), ""]  # fmt: skip
    if stem is not None and table.rows:
        classwise = quote(classwise_plot_name(stem, table))
        out += [f"![class-wise accuracy, table {table.index}]({classwise})", ""]
    if table.failures:
        out += ["### Failures", ""]
        for f in table.failures:
            first = f["error"].splitlines()[0] if f["error"] else ""
            out.append(f"- {md_text(f['method'])} ({md_text(f['setting'])}): {md_text(first)}")
        out.append("")
    for run in table.runs:
        p = run_protocol(run, stem)
        out += [f"### Protocol of run {md_code(run.run_id[:12])}", "", *protocol_table(p), ""]
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
    at = ", ".join(f"{r:g}" for r in radii)
    seen: set[str] = set()
    per_radius = {certified_key(r): ("cert@r", CERTIFIED) for r in radii} | {
        empirical_key(r): ("emp@r", EMPIRICAL) for r in radii
    }
    for metric in metric_catalog(radii, bool(attacks), sampled_in_rounds(board.runs)):
        direction = {True: "higher is better", False: "lower is better", None: "descriptive"}[
            metric.higher_is_better
        ]
        header, description = metric.header, metric.description
        if metric.key in per_radius:  # one line for all radii
            header, template = per_radius[metric.key]
            if header in seen:
                continue
            seen.add(header)
            description = f"{template.format(r='r')}; r = {at}"
        out.append(f"- **{md_text(header)}**: {md_text(description)} ({direction}).")
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


def _beyond_attack(table: Table) -> list[str]:
    """A line per verified-sound row certified above its empirical accuracy at a radius
    (:attr:`~harness.reports.leaderboard.board.Row.beyond_attack`), naming the inputs."""
    lines = []
    for row in table.sound_rows:
        for radius, ids in row.beyond_attack.items():
            shown = ", ".join(str(i) for i in ids[:8]) + (", …" if len(ids) > 8 else "")
            lines.append(
                f"- {md_text(row.method)} ({md_text(row.setting)}) is certified above its empirical "
                f"accuracy at radius {radius:g}: input(s) {shown} certified at {radius:g} or more "
                "were broken by the attack within it or answered otherwise by PREDICT"
            )
    return [*lines, ""] if lines else []


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
