"""The plugin host's confinement (harness/plugin/confinement.py, docs/threat-model.md): the
Landlock ruleset of each ABI, each layer on this kernel, and the refusal on a kernel
without Landlock, with ``--unconfined`` as the recorded way out."""

from __future__ import annotations

import errno
import json
import os
import socket
import sqlite3
import subprocess
import sys

import pytest

from harness.foundation.errors import IdrsError
from harness.plugin import confinement
from harness.plugin.confinement import Grants, refusal, ruleset

CONFINABLE = refusal(confinement.landlock_abi()) is None
needs_landlock = pytest.mark.skipif(not CONFINABLE, reason="this kernel has no Landlock ABI >= 3")

# include/uapi/linux/landlock.h: the access rights, bit by bit, and what each ABI added
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 0x1, 0x2, 0x4, 0x8
TRUNCATE, IOCTL_DEV = 0x4000, 0x8000
GRANTS = Grants(read=("/lib", "/etc/passwd"), write=("/scratch",), devices=("/dev/null",))


def _is_dir(path: str) -> bool:
    return path in ("/lib", "/scratch")


@pytest.mark.parametrize("abi, fs, net, scoped", [
    (1, 0x1FFF, 0, 0),  # EXECUTE ... MAKE_SYM
    (2, 0x3FFF, 0, 0),  # + REFER
    (3, 0x7FFF, 0, 0),  # + TRUNCATE
    (4, 0x7FFF, 0x3, 0),  # + NET_BIND_TCP, NET_CONNECT_TCP
    (5, 0xFFFF, 0x3, 0),  # + IOCTL_DEV
    (6, 0xFFFF, 0x3, 0x3),  # + SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL
    (7, 0xFFFF, 0x3, 0x3),  # (audit logging: no new right)
])  # fmt: skip
def test_the_ruleset_governs_what_each_abi_knows_and_grants_within_it(abi, fs, net, scoped):
    rules = ruleset(GRANTS, abi, _is_dir)
    assert (rules.handled_fs, rules.handled_net, rules.scoped) == (fs, net, scoped)
    granted = dict(rules.rules)
    assert granted["/lib"] == EXECUTE | READ_FILE | READ_DIR
    assert granted["/etc/passwd"] == EXECUTE | READ_FILE  # a file: no directory right
    assert granted["/scratch"] == fs  # everything the ABI governs, beneath the scratch folder
    device = READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0) | (IOCTL_DEV if abi >= 5 else 0)
    assert granted["/dev/null"] == device
    assert all(allowed & ~fs == 0 for allowed in granted.values())  # none beyond the ABI


def test_a_ruleset_needs_landlock():
    with pytest.raises(ValueError):
        ruleset(GRANTS, 0)


def test_no_landlock_system_call_reads_as_abi_0(monkeypatch):
    def enosys(*_):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(confinement, "_syscall", enosys)
    assert confinement.landlock_abi() == 0


@pytest.mark.parametrize("abi", [0, 1, 2])
def test_a_kernel_that_cannot_confine_is_refused_naming_the_feature_and_the_opt_out(abi):
    message = refusal(abi)
    assert "Landlock" in message and "ABI >= 3 (Linux >= 6.2" in message
    assert "--unconfined" in message and "IDRS_BENCH_PLUGINS=''" in message
    assert ("no Landlock" if abi == 0 else f"Landlock ABI {abi}") in message
    assert refusal(3) is None and refusal(7) is None


def test_the_host_refuses_to_confine_itself_with_threads_running():
    """A thread started before confinement would stay outside it: refused."""
    code = ("import threading, time; from harness.plugin import confinement\n"
            "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
            "confinement.confine(confinement.Grants(), abi=7)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and "threads before it is confined" in done.stderr


LAYER = r"""
import json, os, platform, socket, sys
from harness.plugin import confinement as c

layer, scratch, port, outside = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
grants = c.Grants(read=c.existing([*c.python_paths(), *c.SYSTEM_READ]), write=(scratch,),
                  devices=c.existing(c.SYSTEM_DEVICES))
if layer == "landlock":
    c.restrict(c.ruleset(grants, c.landlock_abi()))
else:
    c.install_seccomp(platform.machine())
out = {}

def attempt(name, action):
    try:
        action()
        out[name] = "done"
    except OSError as exc:
        out[name] = exc.errno

attempt("tcp", lambda: socket.create_connection(("127.0.0.1", port), timeout=5).close())
attempt("socketpair", lambda: [s.close() for s in socket.socketpair()])
attempt("write outside", lambda: open(outside, "a").close())
attempt("write scratch", lambda: open(os.path.join(scratch, "f"), "w").close())
attempt("set-uid", lambda: os.chmod(os.path.join(scratch, "f"), 0o4755))
attempt("chmod", lambda: os.chmod(os.path.join(scratch, "f"), 0o600))
attempt("chown", lambda: os.chown(os.path.join(scratch, "f"), os.getuid(), os.getgid()))
attempt("memory", lambda: open(f"/proc/{os.getppid()}/mem", "rb").close())
attempt("signal", lambda: os.kill(os.getppid(), 0))
print(json.dumps(out))
"""


@needs_landlock
@pytest.mark.parametrize("layer, expected", [
    ("landlock", {"tcp": errno.EACCES, "socketpair": "done", "write outside": errno.EACCES,
                  "write scratch": "done", "set-uid": "done", "chmod": "done", "chown": "done",
                  "memory": errno.EACCES, "signal": errno.EPERM}),
    ("seccomp", {"tcp": errno.EPERM, "socketpair": "done", "write outside": "done",
                 "write scratch": "done", "set-uid": errno.EPERM, "chmod": "done",
                 "chown": errno.EPERM, "memory": "done", "signal": "done"}),
])  # fmt: skip
def test_each_layer_alone_refuses_what_it_governs(tmp_path, layer, expected):
    """Landlock alone refuses the TCP connect, the write outside the scratch folder, the
    parent's memory and the signal; the seccomp filter alone refuses the socket and the
    set-uid bit (chown too); each lets through what the other governs."""
    if layer == "landlock" and confinement.landlock_abi() < 6:
        expected = {**expected, "signal": "done"}
    if layer == "landlock" and confinement.landlock_abi() < 4:
        expected = {**expected, "tcp": "done"}
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        done = subprocess.run([sys.executable, "-c", LAYER, layer, str(scratch), str(port),
                               str(outside)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
    assert outside.exists() == (expected["write outside"] == "done")


HALF = """
from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 3


class Half:
    def __init__(self, sigma):
        self.sigma = sigma / 2
        self.regularity = Constant(self.sigma)

    def __call__(self, x):
        import torch

        return torch.full((len(x),), self.sigma, device=x.device)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("half", lambda context, params: Half(params["sigma"])))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("cohen-half", "half", "cohen", {"sigma": 0.5}))
"""

SPEC = """name = "tiny"
[dataset]
name = "ball-2"
test_count = 4
[model]
architecture = "ball-N"
trainer = "none"
[certification]
n0 = 32
n = 200
batch_size = 1024
[[methods]]
name = "cohen-half"
settings = [{ sigma = 0.5 }]
"""


def test_without_landlock_plugins_are_refused_and_an_unconfined_run_says_so(
    install_plugin, tmp_path, monkeypatch, capsys
):
    """On a kernel without Landlock (simulated), a run that loads a third-party plugin
    fails with one error naming the feature and the opt-out; with ``--unconfined`` it runs,
    and its record and its board's protocol header say that its plugins ran unconfined."""
    from harness.cli.main import main
    from harness.store.storedrun import load_runs

    install_plugin("idrs_test_half", HALF, distribution="idrs-test-half")
    monkeypatch.setattr(confinement, "landlock_abi", lambda: 0)
    monkeypatch.delenv(confinement.UNCONFINED_ENV, raising=False)
    spec, db = tmp_path / "tiny.toml", tmp_path / "runs.sqlite"
    spec.write_text(SPEC)
    argv = ["run", str(spec), "--db", str(db), "--quiet", "--no-check"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: third-party plugins run only in a plugin host confined by the kernel" in err
    assert "no Landlock" in err and "--unconfined" in err
    assert main([*argv, "--unconfined"]) == 0
    assert confinement.UNCONFINED_ENV not in os.environ  # (only for the command's duration)
    [run] = load_runs(db)
    assert run.run["plugin_hosts"] == {"third_party": ["idrs-test-half 0.1"],
                                       "confinement": "unconfined"}  # fmt: skip
    capsys.readouterr()
    assert main(["leaderboard", "--db", str(db)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "| plugins |" in line)
    assert "UNCONFINED (--unconfined)" in header
    assert "idrs-test-half 0.1 ran with the user's rights" in header


@needs_landlock
def test_a_confined_run_records_its_plugin_hosts_and_a_resume_unconfined_is_added(
    install_plugin, tmp_path
):
    """The record of a run whose plugins ran confined, then of the same run's checks run
    unconfined: both kept, and the board states the weaker."""
    from harness.audit.audit import Budget
    from harness.audit.auditor import run_checks
    from harness.foundation.progress import Progress
    from harness.plugin.manager import PluginManager
    from harness.reports.leaderboard.stated_protocol import plugin_hosts_statement
    from harness.running.benchmark import load_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark

    install_plugin("idrs_test_half", HALF, distribution="idrs-test-half")
    spec, db = tmp_path / "tiny.toml", tmp_path / "runs.sqlite"
    spec.write_text(SPEC)
    manager = PluginManager()
    run_id = run_benchmark(load_benchmark(spec, []), RunOptions(db=db), Progress(False), manager)
    confined = manager.hosting()
    assert confined == {"third_party": ["idrs-test-half 0.1"],
                        "confinement": confinement.description(confinement.landlock_abi())}  # fmt: skip
    with confinement.opted_out(True):
        tiny = Budget("tiny", coverage_trials=4, coverage_n=50, pairs=1, ascent_steps=1,
                      audited_inputs=1, attack_steps=1, attack_samples=4, orders=1)  # fmt: skip
        run_checks(db, run_id, RunOptions(db=db), Progress(False), PluginManager(), budget=tiny,
                   attack=False)  # fmt: skip
    with sqlite3.connect(db) as con:
        [(recorded,)] = con.execute("SELECT plugin_hosts FROM runs").fetchall()
    unconfined = {"third_party": ["idrs-test-half 0.1"], "confinement": "unconfined"}
    assert json.loads(recorded) == {"varied": [confined, unconfined]}
    assert plugin_hosts_statement(json.loads(recorded)).startswith("UNCONFINED")
    assert "confined by the kernel (Landlock ABI" in plugin_hosts_statement(confined)


def test_an_unconfined_value_other_than_1_is_an_error(monkeypatch):
    monkeypatch.setenv(confinement.UNCONFINED_ENV, "yes")
    with pytest.raises(IdrsError, match="IDRS_BENCH_UNCONFINED='yes'; use 1"):
        confinement.unconfined_requested()


def test_the_seccomp_filter_refuses_other_architectures_and_x32():
    """Classic BPF of the filter: the architecture is checked first (another one's calls
    are refused whole), and x32 numbers (bit 30) are refused on x86_64."""
    program = confinement.seccomp_program("x86_64")
    load_arch, check_arch = program[0], program[1]
    assert load_arch == (0x20, 0, 0, 4) and check_arch[3] == 0xC000003E
    deny = len(program) - 2
    assert program[deny] == (0x06, 0, 0, 0x00050000 | errno.EPERM)
    assert 2 + check_arch[2] == deny  # the mismatch jumps to the refusal
    assert (0x35, deny - 4, 0, 0x40000000) == program[3]
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in program)


@needs_landlock
@pytest.mark.gpu
def test_a_confined_host_certifies_on_cuda(install_plugin, linear_model):
    """A third-party σ-provider certifies on the GPU from its confined host (NVIDIA's
    device files granted, CUDA's caches in the scratch folder): the same certificates as
    Cohen's certifier at half the σ in the harness's process."""
    import torch

    from harness.api import certify
    from harness.plugin.manager import PluginManager

    install_plugin("idrs_test_half", HALF, distribution="idrs-test-half")
    assert PluginManager().registry.get("methods", "cohen-half").sigma_provider == "half"
    model = linear_model(torch.tensor([1.0, 0.0]), 0.0)
    x, y = torch.tensor([[0.3, 0.1], [-0.8, 0.2], [0.05, 0.0]]), torch.tensor([1, 0, 1])
    hosted = certify(model, x, y, method="cohen-half", sigma=0.5, n=2000, batch_size=512,
                     device="cuda")  # fmt: skip
    local = certify(model, x, y, method="cohen", sigma=0.25, n=2000, batch_size=512,
                    device="cuda")  # fmt: skip
    for column in ("prediction", "radius", "p_lower", "sigma", "counts_estimation"):
        assert hosted[column].tolist() == local[column].tolist(), column
