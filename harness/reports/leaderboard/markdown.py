"""The leaderboard as markdown (GitHub-flavoured: tables and footnotes).

Layout, results first: a title and what re-checking the board establishes; per table
(one per dataset and base model) a warning when its runs follow different protocols, the
headline (the best verified-sound rows band by band of radii, and which sound rows the
paired differences put above the best constant-σ row:
:mod:`harness.reports.leaderboard.per_radius_markdown`), then the tables a reader
compares (σ(x) over the inputs as min / median / max, clean accuracy, certified accuracy
at each radius with its 95 % Clopper–Pearson interval, bold where the row is the best
verified-sound one at that radius, the ACR with its t interval, the verdict): the
verified-sound rows, the memory (order-dependent) rows at their worst replayed input
order with the spread over orders, the rows whose radii are not certified (a check
found a problem, did not complete, or none ran), the rows imported from published logs;
the paired differences from the best constant-σ row at each radius; the verdicts as a
matrix of rows and checks (:mod:`harness.reports.leaderboard.verdict_matrix`); the
certified-accuracy plot; the sampling error of the accuracies (the widest half-width
and, on a subset of the test split, how to certify all of it); then the rest of every
row in tables of their own (the empirical attack's robust accuracy; abstention,
misclassification, class-wise accuracy, σ, wall time), the class-wise plot, the
failures, the protocol and spec of each run. The metric legend, what `sound` asserts and
the matrix's footnotes close the document. All text from plugins and specs goes through
:func:`~harness.reports.leaderboard.escape.md_text`; numbers use fixed formats; nothing
depends on the time of rendering, so the same stored runs give the same bytes.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from harness.foundation.verdict import false_alarm_statement
from harness.mathematics.significance import CONFIDENCE, widest_half_width
from harness.reports.leaderboard.board import Board, Row, Table
from harness.reports.leaderboard.envelope import best_rows
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
from harness.reports.leaderboard.per_radius_markdown import (
    differences_table,
    headline,
    identity_columns,
    row_name,
)
from harness.reports.leaderboard.plots import certified_plot_name, classwise_plot_name
from harness.reports.leaderboard.protocol_markdown import protocol_table, protocol_warning
from harness.reports.leaderboard.regions import regions_section
from harness.reports.leaderboard.reproduce import spec_toml
from harness.reports.leaderboard.seeds import seeds_section
from harness.reports.leaderboard.stated_protocol import run_protocol
from harness.reports.leaderboard.verdict_matrix import Footnotes, verdict_matrix


def fmt(metric: Metric, value: Any, interval: tuple[float, float] | None = None) -> str:
    """A cell: the value in the metric's format, with its interval when it has one."""
    if value is None:
        return "–"
    text = f"{value:.{metric.digits}f}" if metric.digits is not None else f"{value:#.3g}"
    if interval is not None and has_interval(metric.key):
        text += f" [{interval[0]:.{metric.digits}f}, {interval[1]:.{metric.digits}f}]"
    return text


def sigma_cell(row: Row) -> str:
    """σ(x) over the row's inputs: ``0.250`` when one σ for all, else min / median / max."""
    low, mid, high = (row.metrics.get(k) for k in ("sigma_min", "sigma_median", "sigma_max"))
    if low is None or high is None:
        return "–"
    return f"{low:.3f}" if low == high else f"{low:.3f} / {mid:.3f} / {high:.3f}"


def _spread(row: Row) -> str:
    """ACR over the replayed input orders of a memory row: min–max (median), P orders."""
    order = row.order or {}
    acr = order.get("acr")
    if not acr:
        return "–"
    return (f"{acr['min']:.3f}–{acr['max']:.3f} (median {acr['median']:.3f}, "
            f"{order.get('orders')} orders)")  # fmt: skip


def _cell(metric: Metric, row: Row, bold: bool) -> str:
    """A ranking cell; the value in bold where the row is the best sound one there."""
    text = fmt(
        metric, row.metrics.get(metric.key), row.metrics.get("intervals", {}).get(metric.key)
    )
    if not bold:
        return text
    value, _, interval = text.partition(" ")
    return f"**{value}**" + (f" {interval}" if interval else "")


def _ranking_table(rows: list[Row], table: Table, catalog: list[Metric], spread: bool = False
                   ) -> list[str]:  # fmt: skip
    """A group's rows in board order, with the columns a reader compares: the verdict
    beside the row's name (on screen however many radii follow), σ(x), the ``main``
    metrics; a certified accuracy in bold where the row is the best verified-sound one at
    that radius."""
    main = [m for m in catalog if m.table == "main"]
    best = {certified_key(r): {id(row) for row in best_rows(table, r)} for r in table.radii}
    names, identity = identity_columns(table)
    head = ["#", *names, "verdict", "σ(x) min / median / max", *[md_text(m.header) for m in main],
            *(["ACR over orders"] if spread else [])]  # fmt: skip
    align = ["--:", *[":--" for _ in names], ":--", "--:",
             *["--:" for _ in main], *([":--"] if spread else [])]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for rank, row in enumerate(rows, 1):
        cells = [str(rank), *identity(row), md_text(row.verdict), sigma_cell(row),
                 *[_cell(m, row, id(row) in best.get(m.key, ())) for m in main],
                 *([_spread(row)] if spread else [])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _detail_table(table: Table, metrics: list[Metric]) -> list[str]:
    """Every row of ``table`` in board order, with ``metrics`` as columns."""
    names, identity = identity_columns(table)
    head = [*names, *[md_text(m.header) for m in metrics]]
    align = [*[":--" for _ in names], *["--:" for _ in metrics]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for row in table.rows:
        intervals = row.metrics.get("intervals", {})
        cells = [*identity(row),
                 *[fmt(m, row.metrics.get(m.key), intervals.get(m.key)) for m in metrics]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _one_sigma_note(table: Table) -> list[str]:
    """The rows whose method declares σ(x) per input (S2's declared regularity is not
    ``constant``) but whose σ(x) is one value on every input: constant-σ smoothing in fact,
    which tests nothing of the input dependence (e.g. a σ-network fitted to its floor)."""
    found = []
    for row in table.rows:
        declared = next((str(c.evidence.get("declared", "")) for c in row.checks
                         if c.check == "sigma-regularity" and isinstance(c.evidence, dict)), None)  # fmt: skip
        low, high = row.metrics.get("sigma_min"), row.metrics.get("sigma_max")
        if declared and not declared.startswith("constant") and low is not None and low == high:
            found.append(f"{row_name(row, table)} at σ = {low:.4g} on all "
                         f"{row.metrics['inputs']} inputs")  # fmt: skip
    if not found:
        return []
    return [f"**One σ for every input.** {'; '.join(found)}: the method sets σ per input "
            "(its declared regularity is not a constant) but gave one σ on every input of "
            "this base model, so the row certifies as constant-σ smoothing at that σ and "
            "tests nothing of its input dependence. Why, for the built-in methods: "
            "docs/benchmarks.md, \"Methods tuned on the training split\".", ""]  # fmt: skip


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
        "Rows are compared paired (same inputs, same model) with the best verified-sound "
        "constant-σ row at each radius, by the interval of the difference (Newcombe's); the "
        f"ACR carries its {CONFIDENCE:.0%} Student t interval over the inputs."
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


SEQUENTIAL_RULES = {
    "mixture-cs-v2": (
        "harness/mathematics/sequential.py: a beta-binomial mixture confidence sequence with a "
        "Clopper–Pearson bound at n_max, valid at the data-dependent stopping time; a radius is "
        "that bound's where the input stopped, continuous, mostly below the fixed-n one, and "
        "clean accuracy is the fixed-n binomial PREDICT applied at the stop, which holds no "
        "guarantee there"),
    "grid-place-v1": (
        "harness/mathematics/gridplace.py: an e-process per grid threshold, tested in order, "
        "each at α; a radius is the grid radius decided, and clean accuracy is PREDICT's "
        "anytime-valid test at the stop, which abstains more often than the fixed-n PREDICT: "
        "a different quantity, lower than a fixed-n row's"),
}  # fmt: skip
"""What each sequential rule's rows measure (docs/sequential.md)."""


def _sequential_note(table: Table) -> list[str]:
    """What a sequential run's rows measure: the same certificates at a data-dependent n,
    their radii and clean accuracy as the run's rule makes them."""
    runs = [run for run in table.runs if sampled_in_rounds([run])]
    if not runs:
        return []
    rules = sorted({run.config["protocol"].get("rule") or "mixture-cs-v2" for run in runs})
    said = "; ".join(f"`{rule}`, {SEQUENTIAL_RULES.get(rule, 'a rule this version does not know')}"
                     for rule in rules)  # fmt: skip
    return [
        f"Sequential sampling (run {', '.join(md_code(r.run_id[:12]) for r in runs)}): each "
        "input's estimation samples are drawn in rounds and stop once its place on the radius "
        f"grid is decided, each certificate at the same α as a fixed-n one (rule {said}). "
        "Certified accuracy at the grid radii is comparable with a fixed-n run's; the ACR falls "
        "by design, since an input stops once its grid place is decided instead of tightening "
        "its radius further (Sun et al., ICLR 2025, on what ACR rewards). `samples` and "
        "`max samples` give the estimation samples behind each certificate.",
        "",
    ]


def _table_section(table: Table, stem: str | None, notes: Footnotes) -> list[str]:
    catalog = metric_catalog(
        table.radii, any(row.attack for row in table.rows), sampled_in_rounds(table.runs)
    )
    title = f"{md_text(table.dataset)} · {md_text(table.architecture)} · " + (
        f"model {md_code(table.recipe_hash[:12])}" if len(table.models) <= 1
        else f"{len(table.models)} base models")  # fmt: skip
    out = [f"## {table.index}. {title}", ""]
    out += protocol_warning(table, stem)
    out += headline(table)
    out += _sequential_note(table)
    out += ["### Verified sound", ""]
    if table.sound_rows:
        out += [*_ranking_table(table.sound_rows, table, catalog), ""]
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
            *_ranking_table(table.memory_rows, table, catalog, spread=True),
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
        out += [*_ranking_table(table.other_rows, table, catalog), ""]
    else:
        out += ["None.", ""]
    if table.imported_rows:
        out += [
            "### Imported from published logs: claims without evidence",
            "",
            "These radii were read from certification logs (`idrs-bench import-log`); no class "
            "counts came with them, so nothing here is checked or certified.",
            "",
            *_ranking_table(table.imported_rows, table, catalog),
            "",
        ]
    out += _one_sigma_note(table)
    out += differences_table(table)
    out += seeds_section(table)
    out += verdict_matrix(table, notes)
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
    out += regions_section(table)
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
        "- **bold**: the best verified-sound row at that radius (the envelope over methods and "
        "σ; the plot's grey line); rows are listed by certified accuracy at the headline radius, "
        "then at the other radii, which ranks nothing across radii."
    )
    out.append(
        "- **σ(x) min / median / max**: σ(x) over the row's inputs, as its certificates record "
        "it (one number: the same σ for every input); a setting's `sigma` is its base level."
    )
    out.append(
        "- **Δ\\@r**: certified accuracy at radius r minus the reference row's (the "
        "verified-sound constant-σ row best at r) on the same inputs, with Newcombe's "
        f"{CONFIDENCE:.0%} interval for paired proportions (Newcombe 1998, method 10); "
        "`above`/`below` only where the interval excludes 0; `not paired`: other inputs."
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
        "- **verdict**: the worst verdict of the soundness checks of the row (each check's "
        "mark: the verdict matrix of its table; the findings of a flagged check: its footnote; "
        "every summary and its evidence: the run export); `not-verified` when a check that "
        "applied did not complete (`error`); only `sound` rows are listed as certified, "
        "`order-dependent` (memory) rows apart, at their worst replayed input order.",
        "",
    ]
    return out


def _how_to_check(stem: str | None, runs: int = 1) -> str:
    """How anyone re-checks the board (of ``runs`` runs) from its own files."""
    name = md_text(stem or "BOARD")
    weights = f"`{name}.weights.pt`" if runs == 1 else f"`{name}.weights-RUN.pt`, one per run"
    return (
        f"Re-check it: `idrs-bench leaderboard --verify {name}.md` re-derives every certificate "
        f"and the verdicts of S0 and the replay check from the evidence in `{name}.run.json` "
        "and re-renders the board; the other checks' verdicts are read as recorded, and re-run "
        "only with `--reaudit` (the command prints, per row, which verdicts it verified). "
        f"`idrs-bench leaderboard --verify {name}.md --replay K` also re-draws K random inputs "
        "of every row from the files shipped beside it (the base model's weights, "
        f"{weights}, and the methods' trained parts), bit for bit on the run's "
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
    notes = Footnotes()
    out = [
        f"# Leaderboard: {md_text(board.title)}",
        "",
        "Rendered by `idrs-bench leaderboard` from the stored run(s) "
        + ", ".join(md_code(run.run_id[:12]) for run in board.runs)
        + ". "
        + _how_to_check(stem, len(board.runs)),
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
