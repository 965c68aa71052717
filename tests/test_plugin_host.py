"""Third-party plugins run in a plugin host, never where samples are drawn or verdicts made
(harness/README.md, "Plugin host"); plugins declare their contract version."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from harness.foundation.errors import ContractError, IdrsError
from harness.foundation.progress import Progress
from harness.plugin.hookspecs import CONTRACT
from harness.plugin.hosting.shared import wire
from harness.plugin.manager import PluginManager


@pytest.fixture
def half(half_sigma_plugin) -> str:
    """The README's example plugin, its σ-provider saying which process imported it."""
    return half_sigma_plugin(says_where=True)


def _roundtrip(value):
    return wire.read_message(io.BytesIO(wire.encode(value)))


def test_the_wire_carries_data_of_every_listed_dtype():
    arrays = {name: (np.arange(6) % 3).astype(name).reshape(2, 3) for name in wire.DTYPES
              if name != "bfloat16"}  # fmt: skip
    value = {"arrays": arrays, "nested": [1, 2.5, None, "σ", True, {"x": [float("nan")]}],
             "tensor": torch.linspace(0, 1, 5), "bf16": torch.ones(3, dtype=torch.bfloat16),
             "ids": torch.arange(4), "bytes": b"\x00\x01state"}  # fmt: skip
    got = _roundtrip(value)
    for name, array in arrays.items():
        assert got["arrays"][name].dtype == array.dtype and np.array_equal(
            got["arrays"][name], array
        )
    assert got["nested"][:5] == [1, 2.5, None, "σ", True] and np.isnan(got["nested"][5]["x"][0])
    assert torch.equal(got["tensor"], value["tensor"]) and got["tensor"].dtype == torch.float32
    assert got["bf16"].dtype == torch.bfloat16 and torch.equal(got["bf16"], value["bf16"])
    assert torch.equal(got["ids"], value["ids"]) and got["bytes"] == value["bytes"]


@pytest.mark.parametrize("value", [{1, 2}, object(), {1: "int key"}, np.array([object()]),
                                   {"__wire__": "ndarray"}])  # fmt: skip
def test_the_wire_refuses_what_is_not_plain_data(value):
    with pytest.raises(wire.WireError):
        wire.encode(value)


def _frame(header: dict, payload: bytes = b"") -> io.BytesIO:
    text = json.dumps(header).encode()
    return io.BytesIO(wire.HEAD.pack(wire.MAGIC, len(text), len(payload)) + text + payload)


@pytest.mark.parametrize("header, payload", [
    ({"__wire__": "ndarray", "dtype": "object", "shape": [1], "blob": 0, "nbytes": 8}, b"x" * 8),
    ({"__wire__": "ndarray", "dtype": "float64", "shape": [2], "blob": 0, "nbytes": 16}, b"x" * 8),
    ({"__wire__": "ndarray", "dtype": "float64", "shape": [2], "blob": 0, "nbytes": 8}, b"x" * 8),
    ({"__wire__": "pickle", "blob": 0, "nbytes": 1}, b"x"),
])  # fmt: skip
def test_the_wire_rejects_a_message_that_is_not_data(header, payload):
    with pytest.raises(wire.WireError):
        wire.read_message(_frame(header, payload))


def test_a_truncated_stream_is_an_error_and_an_empty_one_its_end():
    frame = wire.encode({"x": np.zeros(4)})
    with pytest.raises(wire.WireError):
        wire.read_message(io.BytesIO(frame[:-3]))
    with pytest.raises(EOFError):
        wire.read_message(io.BytesIO(b""))


def test_every_request_is_declared_once_and_has_a_method_on_each_side():
    """The protocol declares each request's fields once; the harness's side sends each by a
    method of its name, the host answers each by the method its table names, and the
    answer limits are keyed by the same names."""
    import inspect

    from harness.plugin.hosting.in_harness.host_client import HostClient
    from harness.plugin.hosting.in_harness.limits import ANSWER_BOUNDS
    from harness.plugin.hosting.in_host.host_requests import Host
    from harness.plugin.hosting.shared import host_protocol as protocol

    assert set(protocol.REQUESTS) == set(protocol.Request)
    assert all(cls.op is op for op, cls in protocol.REQUESTS.items())
    assert set(Host.ANSWERS) == set(protocol.Request)
    assert all(answer.__name__ == op.value for op, answer in Host.ANSWERS.items())
    client = {name for name, _ in inspect.getmembers(HostClient, inspect.isfunction)}
    assert client - {"send"} == {op.value for op in protocol.Request}
    assert set(ANSWER_BOUNDS) <= set(protocol.Request)
    sent = protocol.message(protocol.CheckParams("m", {"a": 1}), threads=2)
    assert sent == {"op": "check_params", "method": "m", "params": {"a": 1}, "threads": 2}
    assert protocol.read(sent) == protocol.CheckParams("m", {"a": 1})
    with pytest.raises(IdrsError, match="the plugin host has no request 'op_describe'"):
        protocol.read({"op": "op_describe"})


@pytest.mark.parametrize("declaration, said", [
    ("", "declares no IDRS_BENCH_CONTRACT, so it was written against contract 1 or 2"),
    ("IDRS_BENCH_CONTRACT = 2", "declares IDRS_BENCH_CONTRACT = 2"),
])  # fmt: skip
def test_a_plugin_of_another_contract_is_refused_with_one_message(
    install_plugin, half, declaration, said
):
    install_plugin("idrs_test_old", half.replace(f"IDRS_BENCH_CONTRACT = {CONTRACT}", declaration))
    manager = PluginManager()
    [failure] = [f for f in manager.failures if f.plugin == "idrs_test_old"]
    assert said in failure.error
    assert f"implements plugin contract {CONTRACT}" in failure.error
    assert "Porting a plugin to contract 4" in failure.error
    assert "cohen-half" not in manager.registry.names("methods")
    assert "cohen" in manager.registry.names("methods")  # the rest keeps working


def test_an_in_process_plugin_of_another_contract_is_refused():
    class Old:
        IDRS_BENCH_CONTRACT = 2

    with pytest.raises(ContractError, match="IDRS_BENCH_CONTRACT = 2"):
        PluginManager(third_party=False).register(Old(), name="old")


def test_every_builtin_plugin_declares_the_contract():
    manager = PluginManager(third_party=False)
    assert manager.failures == []
    assert len(manager.builtin_plugins()) >= 10


def test_a_third_party_plugin_runs_in_the_plugin_host_and_certifies_as_in_process(
    install_plugin, half, linear_model
):
    install_plugin("idrs_test_half", half)
    manager = PluginManager()
    rows = {row["name"]: row for row in manager.describe()}
    assert rows["idrs_test_half"]["runs_in"] == "plugin host"
    assert rows["idrs_test_half"]["provides"]["methods"] == ["cohen-half"]
    assert rows["cohen"]["runs_in"] == "here"
    assert "idrs_test_half" not in sys.modules  # never imported by this process
    [host] = manager._hosts.values()
    said = manager.registry.get("sigma_providers", "half").description
    pid = host.process.host_pid
    assert said == f"imported in process {pid}" and pid not in (os.getpid(), host.process.pid)

    from harness.api import certify

    model = linear_model(torch.tensor([1.0, 0.0]), 0.0)
    x = torch.tensor([[0.3, 0.1], [-0.8, 0.2], [0.05, 0.0]])
    y = torch.tensor([1, 0, 1])
    hosted = certify(model, x, y, method="cohen-half", sigma=0.5, n=2000, batch_size=512)
    local = certify(model, x, y, method="cohen", sigma=0.25, n=2000, batch_size=512)
    for column in ("prediction", "radius", "p_lower", "sigma", "counts_estimation"):
        assert hosted[column].tolist() == local[column].tolist(), column
    assert "idrs_test_half" not in sys.modules


@pytest.mark.long
def test_the_plugins_command_says_where_each_plugin_runs(install_plugin, half):
    install_plugin("idrs_test_half", half)
    out = subprocess.run([sys.executable, "-m", "harness.cli.main", "plugins", "--json"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    rows = {row["name"]: row for row in json.loads(out.stdout)["plugins"]}
    assert rows["idrs_test_half"]["runs_in"] == "plugin host"
    assert rows["idrs_test_half"]["version"] == "0.1"


def test_a_plugin_host_that_dies_is_an_error_naming_it(install_plugin, half):
    """The error names the host's distribution, how it ended and the request it was
    answering."""
    install_plugin("idrs_test_half", half.replace(
        "return torch.full((len(x),), self.sigma, device=x.device)", "os._exit(3)"))  # fmt: skip
    with PluginManager() as manager:
        spec = manager.registry.get("sigma_providers", "half")
        provider = spec.build(_context(manager), {"sigma": 0.5})
        with pytest.raises(IdrsError, match=r"the plugin host of idrs-idrs-test-half .* exited "
                           r"with status 3 while answering the request 'sigma'"):  # fmt: skip
            provider(torch.zeros(2, 2))


def test_a_plugin_that_kills_its_host_when_imported_is_a_failure_and_the_rest_works(
    install_plugin, half
):
    """A distribution whose host dies while it imports its plugins (here: at once) is a
    plugin failure saying how the host ended; the other plugins keep working."""
    install_plugin("idrs_test_half", half)
    install_plugin("idrs_test_exits", "import os\nIDRS_BENCH_CONTRACT = 3\nos._exit(5)\n",
                   distribution="idrs-test-exits")  # fmt: skip
    with PluginManager() as manager:
        [failure] = manager.failures
        assert failure.plugin == "idrs_test_exits" and failure.distribution == "idrs-test-exits"
        assert "the plugin host of idrs-test-exits" in failure.error
        assert "exited with status 5 while answering the request 'describe'" in failure.error
        assert {"cohen-half", "cohen"} <= set(manager.registry.names("methods"))
        assert list(manager._hosts) == ["idrs-idrs-test-half"]


def test_a_component_of_a_host_that_stopped_says_so_and_the_host_serves_again(install_plugin, half):
    """A host killed between two requests (e.g. by the kernel's OOM killer) is started
    again by the next one; a σ-provider it had built says it must be built again (its
    handle is gone), and a new one works."""
    install_plugin("idrs_test_half", half)
    manager = PluginManager()
    spec = manager.registry.get("sigma_providers", "half")
    context = _context(manager)
    provider = spec.build(context, {"sigma": 0.5})
    [host] = manager._hosts.values()
    os.kill(host.process.host_pid, signal.SIGKILL)
    host.process.process.wait()  # (its keeper ends with it)
    with pytest.raises(Exception, match=r"built in a plugin host that has since stopped"):
        provider(torch.zeros(2, 2))
    assert torch.equal(
        spec.build(context, {"sigma": 0.5})(torch.zeros(2, 2)), torch.full((2,), 0.25)
    )


def _context(manager):
    from harness.engine.sampling import SamplingEngine
    from harness.foundation.data import Dataset
    from harness.foundation.protocol import CertificationProtocol
    from harness.plugin.components import BuildContext
    from harness.plugin.model_description import build_model

    model = build_model(manager.registry, "linear-N", (2,), 2, {})
    data = Dataset("t", torch.zeros(4, 2), torch.zeros(4, dtype=torch.long), torch.zeros(2, 2),
                   torch.zeros(2, dtype=torch.long), 2)  # fmt: skip
    protocol = CertificationProtocol(n0=10, n=100, batch_size=64)
    return BuildContext(data, model, torch.device("cpu"), 0, protocol,
                        SamplingEngine(model, 2, torch.device("cpu"), 64, 0),
                        Progress(enabled=False), manager.registry, method="cohen-half")  # fmt: skip


@pytest.mark.long
@pytest.mark.slow
def test_builtin_methods_served_by_a_plugin_host_certify_and_audit_as_in_process(
    tmp_path, monkeypatch
):
    """Every kind of built-in component through the boundary (IDRS_BENCH_ISOLATE=all):
    the same certificates bit for bit, and the same verdicts from the same audit entropy."""
    from harness.audit.audit import Budget
    from harness.audit.auditor import run_checks
    from harness.plugin.hosting.in_harness.hosted_components import CertifierFactory
    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark

    lipschitz = {"train_examples": 64, "train_steps": 10, "lip_sigma": 0.5, "sigma_min": 0.3}
    dual = {"levels": [0.25, 0.5], "estimator_sigma": 0.25, "train_examples": 64,
            "label_samples": 8, "epochs": 1, "estimator_params": {"width": 8}}  # fmt: skip
    raw = {"name": "ball", "seed": 0, "dataset": {"name": "ball-2", "test_count": 10},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 32, "n": 500, "alpha": 0.01, "batch_size": 1024},
           "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]},
                       {"name": "sukenik", "settings": [{"sigma": 0.25, "rate": 0.2, "k": 5}]},
                       {"name": "chen-fgss", "settings": [{"sigma": 0.25, "num_samples": 50}]},
                       {"name": "alfarra-ds-memory", "settings": [{"sigma": 0.25, "steps": 5}]},
                       {"name": "lipschitz-sigma-net", "settings": [lipschitz]},
                       {"name": "dual-rs", "settings": [dual]}]}  # fmt: skip
    budget = Budget("tiny", coverage_trials=20, coverage_n=100, pairs=2, ascent_steps=2,
                    audited_inputs=3, attack_steps=2, attack_samples=16, orders=2,
                    replay_inputs=3)  # fmt: skip
    seen = {}
    for mode in ("third-party", "all"):
        monkeypatch.setenv("IDRS_BENCH_ISOLATE", mode)
        monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / f"cache-{mode}"))
        manager = PluginManager()
        hosted = isinstance(manager.registry.get("certifiers", "cohen").build, CertifierFactory)
        assert hosted == (mode == "all")
        db = tmp_path / f"{mode}.sqlite"
        quiet = Progress(enabled=False)
        run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), quiet, manager)
        checks = run_checks(db, run_id, RunOptions(db=db), quiet, manager, budget=budget,
                            entropy=0xA11, attack=False)  # fmt: skip
        import sqlite3

        with sqlite3.connect(db) as con:
            certificates = con.execute(
                "SELECT method, setting, input_id, prediction, predict, radius, p_lower, sigma, "
                "counts_selection, counts_estimation, evidence, draws FROM certificates "
                "ORDER BY method, setting, input_id").fetchall()  # fmt: skip
        seen[mode] = certificates, {key: [(r.check, r.verdict, r.summary) for r in results]
                                    for key, results in checks.items()}  # fmt: skip
    assert len(seen["all"][0]) == 60 and seen["all"][0] == seen["third-party"][0]
    assert seen["all"][1] == seen["third-party"][1]


def test_the_plugin_host_reports_its_failures_and_obeys_the_plugin_selection(
    install_plugin, half, monkeypatch
):
    install_plugin("idrs_test_half", half)
    install_plugin("idrs_test_broken", "raise ImportError('no module named nonexistent')\n")
    manager = PluginManager()
    assert [(f.plugin, f.error) for f in manager.failures] == [
        ("idrs_test_broken", "ImportError: no module named nonexistent")
    ]
    assert "cohen-half" in manager.registry.names("methods")
    monkeypatch.setenv("IDRS_BENCH_PLUGINS", "idrs_test_broken")
    manager = PluginManager()
    assert "cohen-half" not in manager.registry.names("methods")
    assert [f.plugin for f in manager.failures] == ["idrs_test_broken"]


def test_a_sigma_batch_is_one_round_trip(install_plugin, half):
    install_plugin("idrs_test_half", half)
    manager = PluginManager()
    provider = manager.registry.get("sigma_providers", "half").build(_context(manager),
                                                                     {"sigma": 0.5})  # fmt: skip
    [host] = manager._hosts.values()
    before = host.requests
    assert torch.equal(provider(torch.zeros(64, 2)), torch.full((64,), 0.25))
    assert host.requests == before + 1


def test_sequential_draws_cross_the_boundary_and_certify_as_in_process(tmp_path, monkeypatch):
    """Under sequential sampling the harness draws the rounds and a hosted certifier claims
    from the looks it is sent: the same certificates, looks and stops as in-process."""
    import sqlite3

    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark

    raw = {"name": "ball-seq", "seed": 3, "radii": [0.0, 0.25, 0.5],
           "dataset": {"name": "ball-2", "test_count": 8},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 32, "n": 3000, "alpha": 0.01, "batch_size": 1024,
                             "sampling": "sequential"},
           "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]},
                       {"name": "sukenik", "settings": [{"sigma": 0.25, "rate": 0.2, "k": 5}]}]}  # fmt: skip
    seen = {}
    for mode in ("third-party", "all"):
        monkeypatch.setenv("IDRS_BENCH_ISOLATE", mode)
        db = tmp_path / f"{mode}.sqlite"
        run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                      PluginManager())  # fmt: skip
        with sqlite3.connect(db) as con:
            seen[mode] = con.execute(
                "SELECT method, input_id, prediction, radius, p_lower, draws FROM certificates "
                "ORDER BY method, input_id").fetchall()  # fmt: skip
    assert len(seen["all"]) == 16 and seen["all"] == seen["third-party"]
    looks = [json.loads(row[5])["base"]["looks"] for row in seen["all"]]
    assert all(looks) and min(len(x) for x in looks) < max(len(x) for x in looks)


BLOCKING_HARNESS = """
import threading, time
from harness.plugin.hosting.in_harness.host_process import PluginHost
from harness.plugin.hosting.in_harness.confinement_options import hosts_confined

host = PluginHost("idrs-test-blocking", ["idrs_test_blocking"], confined=hosts_confined(True))
threading.Thread(target=lambda: host.describe(), daemon=True).start()
while host.process is None or host.process.host_pid is None:
    time.sleep(0.01)
print(host.process.host_pid, host.process.pid, flush=True)
time.sleep(600)
"""


def test_a_plugin_host_ends_with_the_harness_even_while_a_plugin_blocks(install_plugin):
    """A harness process killed while its plugin host is inside a plugin's code that never
    returns (here: its import) leaves no host behind: the host watches its parent."""
    install_plugin(
        "idrs_test_blocking",
        "import time\nIDRS_BENCH_CONTRACT = 3\ntime.sleep(600)\n",
        distribution="idrs-test-blocking",
    )
    harness = subprocess.Popen([sys.executable, "-c", BLOCKING_HARNESS], stdout=subprocess.PIPE,
                               text=True, env={**os.environ})  # fmt: skip
    try:
        pids = [int(p) for p in harness.stdout.readline().split()]  # the host, its keeper
        time.sleep(1.0)  # the host is importing the blocking plugin
        for pid in pids:
            os.kill(pid, 0)  # alive
        harness.kill()
        harness.wait()
        deadline = time.monotonic() + 180  # (a limit for a hang: seconds when idle)
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids), "the plugin host outlived the harness"
    finally:
        harness.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


BROKEN_DEVICE = """
import torch
from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 3
FAILED = []


class Plain:
    def __init__(self, sigma):
        self.sigma, self.regularity = sigma, Constant(sigma)

    def __call__(self, x):
        return torch.full((len(x),), self.sigma)


def to(self, *args, **kwargs):  # as torch's CUDA initialization failing in a confined host
    FAILED.append(1)
    raise RuntimeError(f"Unexpected error from cudaGetDeviceCount(): Error 304 (time {len(FAILED)})")


torch.nn.Module.to = to  # (in its own host only)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("plain", lambda context, params: Plain(params["sigma"])))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("first", "plain", "cohen", {"sigma": 0.25}))
    register(MethodSpec("second", "plain", "cohen", {"sigma": 0.5}))
"""


def test_a_failed_build_in_a_host_fails_each_row_with_the_plugins_own_error(
    install_plugin, tmp_path
):
    """A host whose build context fails (as when CUDA cannot initialize there) never keeps
    the base model it was sent: the next row's build sends it again and fails with the
    plugin's own error, naming the distribution, not with a KeyError about a model the host
    never had."""
    import sqlite3

    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark

    install_plugin("idrs_test_broken_device", BROKEN_DEVICE, distribution="idrs-test-broken")
    raw = {"name": "broken", "seed": 0, "dataset": {"name": "ball-2", "test_count": 4},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 32, "n": 200, "batch_size": 1024},
           "methods": [{"name": "first", "settings": [{}]}, {"name": "second", "settings": [{}]},
                       {"name": "cohen", "settings": [{"sigma": 0.25}]}]}  # fmt: skip
    db = tmp_path / "runs.sqlite"
    run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                  PluginManager())  # fmt: skip
    with sqlite3.connect(db) as con:
        failures = dict(con.execute("SELECT method, error FROM failures").fetchall())
        certified = {m for (m,) in con.execute("SELECT DISTINCT method FROM certificates")}
    assert sorted(failures) == ["first", "second"] and certified == {"cohen"}  # the rest goes on
    for method, error in failures.items():
        first_line = error.splitlines()[0]
        assert first_line.startswith("IdrsError: RuntimeError: Unexpected error from "
                                     "cudaGetDeviceCount(): Error 304"), (method, error)  # fmt: skip
        assert "(in the plugin host of idrs-test-broken: " in first_line
        assert "KeyError" not in error
