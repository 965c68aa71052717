"""Fixtures shared by the test modules (a test module never imports another one).

Besides the fixtures below, the fixture modules named in :data:`pytest_plugins` provide
the writers of tiny dataset files (``tests/field_files.py``), the third-party plugins
written against the soundness contract (``tests/soundness_plugins.py``), the rigged
methods of the detection-power measurement (``tests/rigged_methods.py``), the fixed
run behind the golden leaderboard (``tests/golden_run.py``), the engine-patching
plugin and small runs of the replay tests (``tests/replay_plugins.py``), third-party
plugins installed for one test and the README's example plugin they install
(``tests/installed_plugins.py``), the small benchmark file of the tests that run one
(``tests/small_benchmark.py``) and the half-space model of the sequential tests
(``tests/half_space.py``).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from harness.foundation.threads import available_cores, set_passive_wait, thread_count

# Idle OpenMP threads sleep in this process and in the processes the tests start (they
# inherit the environment): pytest-xdist's workers share the cores, and spinning threads
# of two workers slow each other down severalfold (harness/README.md, "Threads"). Set
# before torch starts its OpenMP runtime.
set_passive_wait()

import pytest  # noqa: E402
import torch  # noqa: E402

from harness.plugin.manager import PluginManager  # noqa: E402

# an xdist worker computes in this process with its share of the cores (the processes a
# test starts decide their own counts, as every idrs-bench process does)
torch.set_num_threads(
    thread_count(available_cores(), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
)

pytest_plugins = [
    "tests.field_files",
    "tests.golden_run",
    "tests.soundness_plugins",
    "tests.rigged_methods",
    "tests.replay_plugins",
    "tests.installed_plugins",
    "tests.small_benchmark",
    "tests.half_space",
]


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """Cache trained base models in a session folder, never in the user's home."""
    mp = pytest.MonkeyPatch()
    mp.setenv("IDRS_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session", autouse=True)
def _plugin_hosts():
    """On a kernel that cannot confine plugin hosts (no Landlock ABI >= 3), the suite runs
    them unconfined (the tests of the confinement itself skip there)."""
    from harness.plugin.hosting.shared import landlock, policy

    mp = pytest.MonkeyPatch()
    if policy.refusal(landlock.landlock_abi()) is not None:
        mp.setenv(policy.UNCONFINED_ENV, "1")
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _plugin_hosts_end_with_their_test():
    """A plugin host that a test started ends with the test, with every process it started
    (a host's manager that the test left to the garbage collector would keep it longer:
    harness/README.md, "Plugin host"); hosts running before the test are left running."""
    from harness.plugin.hosting.in_harness.host_process import running_hosts

    before = {id(host) for host in running_hosts()}
    yield
    for host in running_hosts():
        if id(host) not in before:
            host.stop()


@pytest.fixture
def manager():
    """A fresh plugin manager with the built-ins and no third-party plugins."""
    with PluginManager(third_party=False) as made:
        yield made


class LinearModel(torch.nn.Module):
    """f(x) = [w·x > b] as two logits (0, w·x − b)."""

    def __init__(self, w: torch.Tensor, b: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.flatten().clone(), requires_grad=False)
        self.b = b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        margin = x.flatten(1) @ self.w - self.b
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


class BallModel(torch.nn.Module):
    """f = [‖x‖ <= 1] as logits (0, s·(1 − ‖x‖)): class 1 inside the unit ball."""

    def __init__(self, steepness: float = 20.0) -> None:
        super().__init__()
        self.steepness = steepness

    def forward(self, x):
        margin = self.steepness * (1 - x.flatten(1).norm(dim=1))
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


@pytest.fixture(scope="session")
def ball_model() -> type[BallModel]:
    """The unit-ball classifier of Alfarra et al.'s tests (a class: call it)."""
    return BallModel


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on 2 shared cores: intra-op threads only add contention (a module's
    tests compute with one thread; ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def linear_model() -> type[LinearModel]:
    """``linear_model(w, b)``: the base classifier f(x) = [w·x > b] as two logits
    (0, w·x − b), whose smoothed classifier is known exactly for any σ(x)."""
    return LinearModel


def _stored_certificates(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return con.execute("SELECT COUNT(*) FROM certificates").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def _live_processes(text: str, parent: int | None = None) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                line = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as stat:
                state, ppid = stat.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if text in line and state != "Z" and parent in (None, int(ppid)):
            found.append(f"{entry}: {line[:120]}")
    return found


@pytest.fixture(scope="session")
def live_processes():
    """``live_processes(text, parent=None)``: ``"pid: command line"`` of every live process
    (not a zombie, not this one; a child of ``parent`` when given) whose command line holds
    ``text``: what a plugin or an audit left running."""
    return _live_processes


@pytest.fixture(scope="session")
def stored_certificates():
    """``stored_certificates(db)``: rows in a results database's certificates table (0
    while it does not exist yet): what a run killed at a random moment had stored."""
    return _stored_certificates


SPEC_TEMPLATE = """
[dataset]
name = "{dataset}"
test_count = 2

[model]
architecture = "{arch}"
trainer = "gaussian-augmentation"
trainer_params = {{ epochs = 0 }}

[certification]
n0 = {n0}
n = {n}
alpha = {alpha}

[[methods]]
name = "{method}"
settings = [{{ sigma = {sigma} }}]
"""


@pytest.fixture(scope="session")
def spec_template() -> str:
    """A one-method benchmark file (untrained model, two test points) to ``.format`` with
    dataset, arch, n0, n, alpha, method and sigma."""
    return SPEC_TEMPLATE


OPT_IN = ("perf", "reproduction", "published", "long")
"""Markers whose tests run only when a ``-m`` expression names them (``pytest tests/perf
-m perf``, ``pytest -m reproduction``, ``pytest -m published``: the replay of every
published board, and ``pytest -m long``: the tests of a minute or more, both of which CI
runs on every landing after the suite): left out here rather
than by ``-m`` in addopts, so that another ``-m`` (``-m "not slow"``, the fast loop) does
not bring them back."""


def pytest_collection_modifyitems(config, items):
    expression = config.getoption("markexpr") or ""
    named = [marker for marker in OPT_IN if marker in expression]
    kept, left = [], []
    for item in items:
        opted = [m for m in OPT_IN if m in item.keywords]
        (left if opted and not any(m in named for m in opted) else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def scaled_evidence():
    """``scaled_evidence(selection, estimation, scale, alpha=0.001)``: the harness's
    Evidence of hard counts drawn at diagonal scales [B, d] (σ their smallest axes)."""
    import numpy as np

    from harness.engine.draws import Draws, Evidence

    def build(selection, estimation, scale, alpha=0.001) -> Evidence:
        selection = np.asarray(selection, dtype=np.int64)
        estimation = np.asarray(estimation, dtype=np.int64)
        scale = np.asarray(scale, dtype=np.float32)
        sigma = scale.min(axis=1).astype(np.float64)
        base = Draws("hard", int(selection[0].sum()), int(estimation[0].sum()), sigma,
                     selection, estimation, scale=scale)  # fmt: skip
        return Evidence(tuple(range(len(selection))), torch.zeros(len(selection), scale.shape[1]),
                        sigma, alpha, base)  # fmt: skip

    return build
