"""A plugin reaches nothing but its answers: escapes tried from a confined plugin host.

A third-party plugin written for this test tries, when its plugin host imports it, what
an author who wants to top the board would (docs/threat-model.md): drop a ``.pth`` file
and a module into every site-packages folder (and append to a ``.pth`` there, writing
nothing), into the harness's package, the working directory and ``$HOME``; open the run
database for writing and change its stored draws and radii (by its path, and through the
harness's file descriptors); open the harness's memory (``/proc/<ppid>/mem``), the
harness's thread name, ``/proc/sysrq-trigger`` and ``/proc/sys/vm/drop_caches`` for
writing (root writes both without a capability; nothing is written); signal the harness;
connect to a port this test listens on; patch another distribution's plugin. It reports each outcome in its σ-provider's description, which the harness
receives as data. Each attempt fails in the host (the patch changes only its own host);
every row keeps its verdict and the other plugin its σ; nothing it could reach changed
(the working directory, the plugins' own site folder and the harness's package are hashed
before and after, the database too until the next run writes it, the site-packages
folders compared entry by entry, ``$HOME`` searched for the marker); and a run started
afterwards, in a new process, is unaffected; all of it also after ``check --reaudit``
imported the plugin again. Every file the plugin would write bears a marker name,
removed at the end whatever happened, and appending writes nothing, so a failure of the
confinement leaves the machine as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import site
import socket
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import harness
from harness.audit.audit import BUDGETS, Budget
from harness.audit.auditor import run_checks
from harness.cli.main import main
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict, overall
from harness.plugin.hosting.shared import landlock, policy
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark

pytestmark = pytest.mark.skipif(
    policy.refusal(landlock.landlock_abi()) is not None,
    reason="this kernel has no Landlock ABI >= 3: plugin hosts cannot be confined here",
)

ESCAPE = '''
"""At its import in the plugin host, tries to reach beyond its answers; reports each try."""
import json
import os
import signal
import socket
import sqlite3

from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 3
MARK = os.environ["IDRS_TEST_ESCAPE_MARK"]
GUARDED = json.loads(os.environ["IDRS_TEST_ESCAPE_GUARDED"])
OUTCOMES = {}


def attempt(name, action):
    try:
        action()
        OUTCOMES[name] = "done"
    except Exception as exc:
        OUTCOMES[name] = f"refused: {type(exc).__name__}: {exc}"


def drop(folder):
    def action():
        with open(os.path.join(folder, MARK + ".py"), "w") as out:
            out.write("import os\\nos.environ['IDRS_TEST_ESCAPED'] = '1'\\n")
        with open(os.path.join(folder, MARK + ".pth"), "w") as out:
            out.write(f"import {MARK}\\n")

    return action


def append(path):  # opened for writing, nothing written
    return lambda: open(path, "a").close()


def rewrite_draws():
    with sqlite3.connect(GUARDED["db"]) as con:
        con.execute("UPDATE certificates SET draws = '{}', radius = 2 * radius")


def descriptors():
    folder = f"/proc/{os.getppid()}/fd"
    for fd in os.listdir(folder):
        open(os.path.join(folder, fd), "r+b").close()


def memory():
    with open(f"/proc/{os.getppid()}/mem", "r+b") as mem, open(f"/proc/{os.getppid()}/maps") as maps:
        readable = next(line for line in maps if line.split()[1].startswith("r"))
        mem.seek(int(readable.split("-")[0], 16))
        mem.read(8)


def patch_victim():
    import idrs_test_victim

    idrs_test_victim.HalfSigma.__call__ = lambda self, x: 8 * self.sigma + 0 * x.flatten(1)[:, 0]


for folder in GUARDED["site"]:
    attempt(f"site-packages {folder}", drop(folder))
for path in GUARDED["pth"]:
    attempt(f"append to {path}", append(path))
attempt("harness package", drop(GUARDED["harness"]))
attempt("working directory", drop(os.getcwd()))
attempt("home", drop(GUARDED["home"]))
attempt("run database", rewrite_draws)
attempt("run database through the harness's descriptors", descriptors)
attempt("harness memory", memory)
# root writes these without any capability: a reboot, dropped caches (opened, never written)
attempt("/proc/sysrq-trigger", lambda: os.close(os.open("/proc/sysrq-trigger", os.O_WRONLY)))
attempt("/proc/sys/vm/drop_caches", lambda: os.close(os.open("/proc/sys/vm/drop_caches", os.O_WRONLY)))
attempt("the harness's thread name", append(f"/proc/{os.getppid()}/task/{os.getppid()}/comm"))
attempt("signal the harness", lambda: os.kill(os.getppid(), signal.SIGCONT))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", GUARDED["port"]), 5).close())
attempt("patch another plugin", patch_victim)


class Escape:
    regularity = Constant(0.25)

    def __call__(self, x):
        import torch

        return torch.full((len(x),), 0.25, device=x.device)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("escape", lambda context, params: Escape(), json.dumps(OUTCOMES)))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("escape", "escape", "cohen", {}))
'''

TINY = Budget("tiny", coverage_trials=8, coverage_n=200, pairs=2, ascent_steps=2,
              audited_inputs=3, attack_steps=2, attack_samples=8, orders=2)  # fmt: skip
ENTROPY = 0x47_E5C
"""The audits' entropy: fixed, so that the verdicts asserted here are the same every time
(with fresh entropy a sound row is flagged 1 time in 1,000, as the checks promise)."""


def _ball(name: str, methods: list[str]) -> dict:
    return {"name": name, "seed": 0, "dataset": {"name": "ball-2", "test_count": 6},
            "model": {"architecture": "ball-N", "trainer": "none"},
            "certification": {"n0": 32, "n": 400, "alpha": 0.01, "batch_size": 1024},
            "methods": [{"name": m, "settings": [{"sigma": 0.5} if m == "cohen" else {}]}
                        for m in methods]}  # fmt: skip


def _tree(folder: Path, skip=("__pycache__",)) -> str:
    """SHA-256 of every file beneath ``folder`` (path and bytes), ``skip`` left out."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for name in sorted(files):
            path = Path(root) / name
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _listing(folder: Path) -> dict[str, tuple[int, int] | None]:
    """A shared folder's entries (files: size and modification time), for a folder other
    processes of this machine may add to while the test runs."""
    out = {}
    for entry in os.scandir(folder):
        stat = entry.stat(follow_symlinks=False)
        out[entry.name] = (stat.st_size, stat.st_mtime_ns) if entry.is_file() else None
    return out


def _certificates(db: Path, run_id: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT method, input_id, radius, p_lower, sigma, draws FROM "
                           "certificates WHERE run_id = ? ORDER BY method, input_id",
                           (run_id,)).fetchall()  # fmt: skip


SECOND_RUN = """
import json, sys
from harness.cli.main import main
status = main(["run", sys.argv[1], "--db", sys.argv[2], "--quiet", "--no-check"])
print(json.dumps({"status": status, "marked": [m for m in sys.modules if m.startswith(sys.argv[3])],
                  "escaped": __import__("os").environ.get("IDRS_TEST_ESCAPED")}))
"""


@pytest.mark.long
def test_a_plugin_reaches_nothing_but_its_answers(
    install_plugin, half_sigma_plugin, tmp_path, monkeypatch
):
    mark = f"zz_idrs_escape_{uuid.uuid4().hex[:12]}"
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "notes.txt").write_text("the harness's working directory\n")
    monkeypatch.chdir(work)
    db = tmp_path / "runs.sqlite"
    quiet = Progress(enabled=False)
    honest = run_benchmark(parse_benchmark(_ball("honest", ["cohen"])), RunOptions(db=db), quiet,
                           PluginManager(third_party=False))  # fmt: skip
    before_run = _certificates(db, honest)

    # another distribution's plugin: Cohen at half the σ
    victim = half_sigma_plugin(provider="victim", method="victim")
    own_site = install_plugin("idrs_test_victim", victim, distribution="idrs-test-victim")
    sites = [Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()]
             if Path(p).is_dir()]  # fmt: skip
    home, package = Path.home(), Path(harness.__file__).parent
    pth = sorted(str(p) for folder in sites for p in folder.glob("*.pth"))[:3]
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    monkeypatch.setenv("IDRS_TEST_ESCAPE_MARK", mark)
    monkeypatch.setenv("IDRS_TEST_ESCAPE_GUARDED", json.dumps({
        "site": [str(p) for p in [*sites, own_site]], "pth": pth, "harness": str(package),
        "home": str(home), "db": str(db), "port": listener.getsockname()[1]}))  # fmt: skip
    install_plugin("idrs_test_escape", ESCAPE, distribution="idrs-test-escape")
    guarded = {"db": db.read_bytes(), "cwd": _tree(work), "own site": _tree(own_site),
               "harness": _tree(package), **{str(p): _listing(p) for p in sites}}  # fmt: skip
    try:
        manager = PluginManager()
        outcomes = json.loads(manager.registry.get("sigma_providers", "escape").description)
        hosts = {name: host for name, host in manager._hosts.items()}
        assert sorted(hosts) == ["idrs-test-escape", "idrs-test-victim"]  # a host each
        assert all(host.abi == landlock.landlock_abi() for host in hosts.values())
        assert len(outcomes) == len(sites) + 1 + len(pth) + 12, outcomes
        if not Path("/proc/sysrq-trigger").exists():  # a kernel without magic SysRq
            assert outcomes.pop("/proc/sysrq-trigger").startswith("refused: FileNotFoundError")
        tried = {k: v for k, v in outcomes.items() if k != "patch another plugin"}
        assert all(v.startswith("refused: ") for v in tried.values()), tried
        assert outcomes["patch another plugin"] == "done"  # in its own host only (below)
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection ever came
        assert db.read_bytes() == guarded["db"]

        run = run_benchmark(parse_benchmark(_ball("escape", ["cohen", "escape", "victim"])),
                            RunOptions(db=db), quiet, manager)  # fmt: skip
        results = run_checks(db, run, RunOptions(db=db), quiet, manager, budget=TINY,
                             entropy=ENTROPY, attack=False)  # fmt: skip
        for key, checks in results.items():  # every row keeps its verdict
            assert overall(checks) == Verdict.SOUND, (key, [(r.check, r.verdict) for r in checks])
        sigmas = {m: s for m, _, _, _, s, _ in _certificates(db, run)}
        assert sigmas == {"cohen": 0.5, "escape": 0.25, "victim": 0.25}  # the victim: σ/2
        assert _certificates(db, honest) == before_run  # the stored draws and radii
        # a re-audit imports the plugin again, in a host of its own command: confined too
        monkeypatch.setitem(BUDGETS, TINY.name, TINY)
        reaudit = ["check", run[:12], "--db", str(db), "--reaudit", "--method", "escape", "--quiet"]
        assert main(reaudit) == 0

        assert _tree(work) == guarded["cwd"] and _tree(own_site) == guarded["own site"]
        assert _tree(package) == guarded["harness"]
        for folder in sites:  # shared with this machine's other processes: what was there
            now = _listing(folder)
            assert {k: now.get(k) for k in guarded[str(folder)]} == guarded[str(folder)], folder
        for folder in [*sites, home]:  # (the plugin's writes would bear its mark)
            assert not list(folder.glob(f"{mark}*")), folder

        spec = tmp_path / "second.toml"
        spec.write_text('name = "second"\n[dataset]\nname = "ball-2"\ntest_count = 4\n[model]\n'
                        'architecture = "ball-N"\ntrainer = "none"\n[certification]\nn0 = 32\n'
                        'n = 200\n[[methods]]\nname = "victim"\nsettings = [{}]\n')  # fmt: skip
        second = subprocess.run([sys.executable, "-c", SECOND_RUN, str(spec),
                                 str(tmp_path / "second.sqlite"), mark], capture_output=True,
                                text=True, env={**os.environ})  # fmt: skip
        said = json.loads(second.stdout.strip().splitlines()[-1])
        assert said == {"status": 0, "marked": [], "escaped": None}, second.stderr
    finally:
        listener.close()
        for folder in [*sites, own_site, package, work, home]:
            for path in folder.glob(f"{mark}*"):
                path.unlink()
