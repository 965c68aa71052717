"""A run's protocol on a board, in markdown: the protocol table (dataset, test subset,
certification protocol and arithmetic, base model, hashes, how its third-party plugins
ran, what its plugins had of the test split, seeds, versions, commit, dates, how to
reproduce it) and the warning a table gets when its runs follow different
protocols (:mod:`harness.reports.leaderboard.stated_protocol` states them)."""

from __future__ import annotations

from typing import Any

from harness.foundation.protocol import PRECISION_MEANINGS
from harness.reports.leaderboard.board import Table
from harness.reports.leaderboard.escape import md_code, md_text
from harness.reports.leaderboard.stated_protocol import (
    plugin_hosts_statement,
    protocol_differences,
    run_protocol,
    statement_of_test_split,
)


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {params[k]}" for k in sorted(params)) or "defaults"


def _arithmetic(p: dict[str, Any]) -> str:
    """``, precision bf16, channels-last, noise philox-v1`` (runs that record them; the
    forward options when on); on CUDA what the precision computes (``tf32-conv``:
    PyTorch's default arithmetic)."""
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
    if p.get("fold_batchnorm"):
        out += ", BatchNorm folded into the convolutions"
    if p.get("compile"):
        out += ", compiled (torch.compile)"
    if p.get("cuda_graphs"):
        out += ", CUDA graphs"
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


def protocol_warning(table: Table, stem: str | None) -> list[str]:
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


def protocol_table(p: dict[str, Any]) -> list[str]:
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
        *([("weights: parameters' digest", f"{md_code(p['weights_digest'])} (SHA-256 over each "
            "tensor's name, dtype, shape and bytes; not the file's)")]
          if p.get("weights_digest") else []),
        *([("weights file: SHA-256", f"{md_code(p['weights_file_sha256'])} (of the shipped "
            "file, as `sha256sum` gives it)")] if p.get("weights_file_sha256") else []),
        *([("arithmetic", _fingerprint(p["arithmetic"]))] if p.get("arithmetic") else []),
        *([("plugins", md_text(plugin_hosts_statement(p["plugin_hosts"])))]
          if p.get("plugin_hosts") else []),
        *([("test split", md_text(statement_of_test_split(p["test_split"])))]
          if p.get("test_split") else []),
        ("seeds", f"certification {p['seed']}, model {p['model_seed']}"),
        ("device", md_text(p["device"])),
        ("versions", md_text(versions)),
        ("git commit", md_code(p["git_commit"]) if p["git_commit"] else "unknown"),
        ("date", f"started {md_code(p['created'])}, finished "
                 + (md_code(p["finished"]) if p["finished"] else "never")),
        ("reproduce", f"{md_code(p['command'])} at that commit, with the spec below"),
    ]  # fmt: skip
    return ["| | |", "|:--|:--|", *[f"| {k} | {v} |" for k, v in items]]
