"""A stored run written into another results database, so that the checks can run on it.

A re-audit (:mod:`harness.audit.reaudit`) re-runs a run's checks through the same code
as ``idrs-bench check``, which reads a results database. A board's runs come from its
run export (:mod:`harness.reports.leaderboard.source`), so :func:`copy_run` writes a
:class:`~harness.store.storedrun.StoredRun` into a fresh store: what an audit reads (the
``runs`` row with its data files, arithmetic, components, plugin hosts and test-split
record, every certificate with its evidence, the files a replay needs) and nothing it
would write (checks, attacks).
"""

from __future__ import annotations

import json

from harness.store.schema import CERTIFICATE_INSERT
from harness.store.store import ResultStore
from harness.store.storedrun import StoredRun


def copy_run(store: ResultStore, run: StoredRun) -> None:
    """Write ``run`` (its ``runs`` row, certificates and files, each file at ``path``) into
    ``store``, finished; a run already there is left as it is."""
    row = run.run
    if not store.begin_run(
        run.run_id, row["name"], row["config"], row.get("versions") or {}, row.get("git_commit"),
        row["device"], row["seed"], row["recipe_hash"], weights_digest=row.get("weights_digest"),
        test_split=row.get("test_split"),
    ):  # fmt: skip
        return
    inputs = run.expected_inputs or max(run.counts().values(), default=0)
    store.set_run_data(run.run_id, inputs, run.data_files or {}, row.get("class_names") or ())
    if row.get("arithmetic"):
        store.record_arithmetic(run.run_id, lambda _: dict(row["arithmetic"]))  # (as recorded)
    if row.get("components"):
        store.record_components(run.run_id, row["components"])
    if row.get("plugin_hosts"):
        for hosting in row["plugin_hosts"].get("varied", [row["plugin_hosts"]]):
            store.record_plugin_hosts(run.run_id, hosting)
    for f in run.files:
        store.add_file(run.run_id, f["role"], f["name"], f["path"], f["sha256"], f["meta"])
    with store.db:
        store.db.executemany(
            CERTIFICATE_INSERT,
            [{"run_id": run.run_id, "method": c.method, "setting": c.setting,
              "input_id": c.input_id, "shard": c.shard or 0, "label": c.label,
              "prediction": c.prediction, "predict": c.predict, "radius": c.radius,
              "p_lower": c.p_lower, "sigma": c.sigma, "alpha": c.alpha,
              "counts_selection": json.dumps(c.counts_selection),
              "counts_estimation": json.dumps(c.counts_estimation), "seconds": c.seconds,
              "load": c.load, "evidence": json.dumps(c.evidence),
              "draws": None if c.draws is None else json.dumps(c.draws),
              "region": None if c.region is None else json.dumps(c.region)}
             for c in run.certificates],
        )  # fmt: skip
    store.finish_run(run.run_id)
