"""The protocol of a stored run as a leaderboard states it (header, JSON, CSV, compare)."""

from __future__ import annotations

from typing import Any

from harness.foundation.data import WITHHELD
from harness.foundation.protocol import FORWARD_OPTIONS
from harness.reports.leaderboard.reproduce import run_command, spec_filename
from harness.store.storedrun import StoredRun

ARITHMETIC_KEYS = ("precision", "channels_last", "noise", "cudnn", *FORWARD_OPTIONS)
"""Protocol keys recorded since the engine offers precisions and noise schemes (``cudnn``
only when it is not the default ``heuristic``, the forward options only when on)."""
COMPARED_KEYS = ("n0", "n", "alpha", "precision", "channels_last", "noise", "cudnn",
                 *FORWARD_OPTIONS, "sampling", "n_max", "test_split")  # fmt: skip
"""Protocol keys whose difference makes two runs' rows not directly comparable."""
NOT_RECORDED = ("not recorded (the run began before runs recorded it, so its plugins may "
                "have read it)")  # fmt: skip
"""A run's ``test_split`` when it records none (a run begun before the harness withheld the
test split from plugins)."""


def protocol_differences(protocols: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The keys of :data:`COMPARED_KEYS` on which the runs of one table differ, with the
    values (a missing precision reads fp32, a missing noise block-v1)."""
    legacy = {"precision": "fp32", "channels_last": False, "noise": "block-v1",
              "cudnn": "heuristic", "sampling": "fixed", "n_max": None,
              **dict.fromkeys(FORWARD_OPTIONS, False), "test_split": NOT_RECORDED}  # fmt: skip
    out = {}
    for key in COMPARED_KEYS:
        values = [str(p.get(key, legacy.get(key))).lower() for p in protocols]
        if len(set(values)) > 1:
            out[key] = list(dict.fromkeys(values))
    return out


def run_protocol(run: StoredRun, stem: str | None) -> dict[str, Any]:
    """Everything that fixes what a run measured, and how to run it again.

    ``stem`` names the board, whose folder holds the run's spec file (None: no file
    is written, and the command names ``SPEC.toml``, the spec shown on the board).
    """
    row, config = run.run, run.run["config"]
    dataset, model, protocol = config["dataset"], config["model"], config["protocol"]
    spec_file = "SPEC.toml" if stem is None else spec_filename(stem, row["run_id"])
    # runs stored before the protocol recorded its arithmetic and noise have none of these
    # keys (fp32, block-v1); boards of such runs stay as they were rendered
    arithmetic = {k: protocol[k] for k in ARITHMETIC_KEYS if k in protocol}
    out = {
        "run_id": row["run_id"],
        "name": row["name"],
        "dataset": dataset["name"],
        "test_every": dataset.get("test_every", 1),
        "test_count": dataset.get("test_count"),
        "inputs": max(run.counts().values(), default=0),
        "n0": protocol["n0"],
        "n": protocol["n"],
        "alpha": protocol["alpha"],
        "batch_size": protocol.get("batch_size"),
        **arithmetic,
        "architecture": model["architecture"],
        "architecture_params": model.get("architecture_params", {}),
        "trainer": model["trainer"],
        "trainer_params": model.get("trainer_params", {}),
        "model_seed": model.get("seed", 0),
        "recipe_hash": row["recipe_hash"],
        "seed": row["seed"],
        "device": row["device"],
        "versions": dict(sorted(row["versions"].items())),
        "git_commit": row["git_commit"],
        "created": row["created"],
        "finished": row["finished"],
        "spec_file": spec_file,
        "command": run_command(spec_file, row["device"]),
    }
    if protocol.get("sampling") == "sequential":  # (fixed runs record neither)
        out["sampling"], out["n_max"] = "sequential", protocol["n_max"]
    if row.get("weights_digest"):  # runs from before weights digests have none
        out["weights_digest"] = row["weights_digest"]  # of the parameters, not of a file
    shipped = next((f for f in run.files if f.get("role") == "weights"), None)
    if shipped is not None:  # the file a board ships (harness.running.runfiles.WEIGHTS)
        out["weights_file_sha256"] = shipped["sha256"]
    if row.get("arithmetic"):  # where its counts replay bit for bit (harness.engine.arithmetic)
        out["arithmetic"] = row["arithmetic"]
    if row.get("plugin_hosts"):  # runs from before plugin hosts were confined have none
        out["plugin_hosts"] = row["plugin_hosts"]
    if row.get("test_split"):  # runs begun before the test split was withheld have none,
        out["test_split"] = row["test_split"]  # and their boards stay as they were rendered
    return out


def statement_of_test_split(record: str | None) -> str:
    """What a run's plugins had of the test split (its ``test_split`` record), in a line."""
    if record == WITHHELD:
        return ("withheld from every plugin (σ-providers, certifiers and the trainer got the "
                "training split and the dataset's description, a σ-provider each test input "
                "only when asked for its σ, no plugin a test label; docs/plugins.md)")  # fmt: skip
    return NOT_RECORDED if record is None else f"unknown record {record!r}"


def plugin_hosts_statement(record: dict[str, Any]) -> str:
    """How a run's third-party plugins ran (:meth:`harness.store.store.ResultStore.
    record_plugin_hosts`), in a line: unconfined first, when any process ran them so."""
    processes = record.get("varied", [record])
    packages = sorted({p for h in processes for p in h.get("third_party", ())})
    if not packages:
        return "built-ins only (no third-party plugin loaded)"
    named = ", ".join(packages)
    if any(h.get("confinement") == "unconfined" for h in processes):
        return (f"UNCONFINED (--unconfined): {named} ran with the user's rights, able to reach "
                "the harness's files and processes (docs/threat-model.md)")  # fmt: skip
    ways = sorted({h["confinement"] for h in processes if h.get("third_party")})
    limits = sorted({h["plugin_timeout"] for h in processes if h.get("plugin_timeout")})
    limited = f"; a request to a host limited to {' or '.join(f'{s:g}' for s in limits)} s"
    return (f"{named}, each in a plugin host confined by the kernel ({'; '.join(ways)})"
            + (limited if limits else ""))  # fmt: skip
