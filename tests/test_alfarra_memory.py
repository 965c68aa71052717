"""Memory-based certification (Alfarra et al. 2022, Alg. 3, App. C): geometry by hand,
the invariant on random balls in 2-D and 784-D, the wrapper and its persistence."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from harness.engine.draws import Claim, Evidence
from harness.foundation.certificate import ABSTAIN, Certificate
from harness.foundation.runstate import RunState
from harness.mathematics.radius import COHEN
from harness.store.store import ResultStore
from plugins.alfarra.certifier import MemoryCertifier
from plugins.alfarra.memory import INSIDE, KEPT, SHRUNK, Memory
from plugins.alfarra.memory_store import restore


def _insert(memory, points):
    return [
        memory.certify(i, torch.tensor(x, dtype=torch.float32), c, r)
        for i, (x, c, r) in enumerate(points)
    ]


def test_largest_in_and_out_subsets_by_hand_in_2d():
    memory = Memory()
    out = _insert(
        memory,
        [
            ((0, 0), 0, 2.0),  # kept
            ((1.5, 0), 1, 3.0),  # inside ball 0: class 0, radius 2 - 1.5
            ((5, 0), 1, 4.0),  # meets ball 0 (5 < 2 + 4): radius 5 - 2; touches ball 1 only
            ((5, 1), 0, 10.0),  # inside ball 2 (class 1, radius 3): radius 3 - 1
            ((0, 10), ABSTAIN, 0.0),  # an abstention: the point (0, 10) answers ABSTAIN
            ((0, 9), 0, 5.0),  # its ball holds the abstained point: radius 1
            ((0, 10), 0, 3.0),  # the abstained point itself: ABSTAIN, radius 0
            ((9, 9), 2, 1.0),  # far from everything: kept
            ((0, 0.5), 2, 0.3),  # inside ball 0 but small: class 0, radius min(0.3, 2 - 0.5)
        ],
    )
    got = [(e.prediction, e.radius, e.action, e.decided_by) for e in out]
    assert got == [
        (0, 2.0, KEPT, ()),
        (0, 0.5, INSIDE, (0,)),
        (1, 3.0, SHRUNK, (0,)),
        (1, 2.0, INSIDE, (2,)),
        (ABSTAIN, 0.0, KEPT, ()),
        (0, 1.0, SHRUNK, (4,)),
        (ABSTAIN, 0.0, INSIDE, (4,)),
        (2, 1.0, KEPT, ()),
        (0, 0.3, INSIDE, (0,)),
    ]
    assert [e.raw_radius for e in out] == [2.0, 3.0, 4.0, 10.0, 0.0, 5.0, 3.0, 1.0, 0.3]


def test_the_same_input_id_again_returns_its_entry_and_a_different_content_is_refused():
    memory = Memory()
    first = memory.certify(7, torch.tensor([0.0, 0.0]), 0, 2.0)
    assert memory.certify(7, torch.tensor([0.0, 0.0]), 1, 9.0) == first
    assert len(memory) == 1
    with pytest.raises(Exception, match="different content"):
        memory.certify(7, torch.tensor([1.0, 0.0]), 0, 2.0)


def _random_points(rng, n, d, spread, max_radius, classes=3):
    x = rng.uniform(0, spread, size=(n, d))
    dup = rng.choice(n, size=n // 10, replace=False)
    x[dup[1:]] = x[dup[:-1]]  # some inputs repeat exactly
    predictions = rng.integers(0, classes, size=n)
    radii = rng.uniform(0, max_radius, size=n)
    abstain = rng.random(n) < 0.1
    predictions[abstain], radii[abstain] = ABSTAIN, 0.0
    return x, predictions, radii


@pytest.mark.parametrize(
    ("d", "n", "spread", "max_radius"), [(2, 150, 10.0, 3.0), (784, 100, 1.0, 8.0)]
)
def test_invariant_after_every_insertion_on_random_balls(d, n, spread, max_radius):
    rng = np.random.default_rng(d)
    x, raw_pred, raw_rad = _random_points(rng, n, d, spread, max_radius)
    dist = cdist(x, x)  # independent of the memory's own distances
    tol = 1e-9 * max(spread * np.sqrt(d), 1.0)
    memory = Memory()
    actions = set()
    for k in range(n):
        before = [(e.prediction, e.radius) for e in memory.entries]
        entry = memory.certify(k, torch.tensor(x[k]), int(raw_pred[k]), float(raw_rad[k]))
        actions.add(entry.action)
        # earlier entries never change; the new radius never grows
        assert [(e.prediction, e.radius) for e in memory.entries[:k]] == before
        assert 0.0 <= entry.radius <= raw_rad[k]
        pred = memory.predictions[: k + 1]
        rad = memory.radii[: k + 1]
        # a point inside an earlier ball (or on an earlier point) takes its prediction
        inside = (dist[k, :k] < rad[:k] - tol) | (dist[k, :k] == 0)
        assert np.all(pred[:k][inside] == entry.prediction)
        # no two regions with different predictions intersect (open balls plus centres)
        differ = pred[:, None] != pred[None, :]
        d_sub = dist[: k + 1, : k + 1]
        assert np.all(d_sub[differ] >= (rad[:, None] + rad[None, :])[differ] - tol)
        assert np.all(d_sub[differ] > 0)
        # an input with no conflict keeps its certificate
        others = raw_pred[k] != pred[:k]
        conflict = others & ((dist[k, :k] < rad[:k] + raw_rad[k]) | (dist[k, :k] == 0))
        if not conflict.any():
            assert (entry.prediction, entry.radius) == (raw_pred[k], raw_rad[k])
    assert actions == {KEPT, INSIDE, SHRUNK}  # every branch was exercised


class _Table:
    """An inner certifier that claims fixed (prediction, radius, PREDICT) per input id."""

    smoothing, order_dependent, radius_formula = "hard", False, COHEN

    def __init__(self, table):
        self.table = table

    def certify(self, evidence):
        claims = []
        for i in evidence.input_ids:
            prediction, radius, predict = self.table[i]
            claims.append(Claim(prediction, radius, 0.9, predict, {"inner": i}))
        return claims


def _evidence(x, ids):
    """Evidence for inputs ``x`` (the table certifier reads only their ids)."""
    return Evidence.from_counts(np.ones((len(ids), 2)), np.ones((len(ids), 2)), 1.0, 0.001,
                                input_ids=ids, x=x)  # fmt: skip


def test_wrapper_processes_in_input_order_and_records_the_evidence():
    table = {10: (0, 2.0, 0), 11: (1, 3.0, 1), 12: (1, 4.0, ABSTAIN)}
    x = torch.tensor([[0.0, 0.0], [1.5, 0.0], [5.0, 0.0]])
    certifier = MemoryCertifier(_Table(table), Memory())
    c10, c11, c12 = certifier.certify(_evidence(x, [10, 11, 12]))
    assert (c11.prediction, c11.radius, c11.predict) == (0, 0.5, 0)  # LargestInSubset
    assert (c12.prediction, c12.radius, c12.predict) == (1, 3.0, ABSTAIN)  # LargestOutSubset
    assert c11.evidence == {
        "inner": 11,
        "memory_position": 1,
        "memory_raw_prediction": 1,
        "memory_raw_radius": 3.0,
        "memory_raw_predict": 1,
        "memory_action": INSIDE,
        "memory_decided_by": [10],
    }
    assert c12.evidence["memory_decided_by"] == [10] and c10.evidence["memory_action"] == KEPT


def test_a_restored_memory_continues_exactly_as_an_uninterrupted_one(tmp_path):
    rng = np.random.default_rng(1)
    x, pred, rad = _random_points(rng, 60, 2, 6.0, 2.5)
    x = torch.tensor(x, dtype=torch.float32)
    table = {i: (int(pred[i]), float(rad[i]), int(pred[i])) for i in range(60)}
    ids = list(range(60))
    path = tmp_path / "memory.sqlite"

    def one_by_one(certifier, ids):
        """(id, claim) per input, the certifier called once per input as a run calls it."""
        for i in ids:
            [claim] = certifier.certify(_evidence(x[i : i + 1], [i]))
            yield i, claim

    def results(claims):
        return [(i, c.prediction, c.radius, c.evidence) for i, c in claims]

    reference = results(one_by_one(MemoryCertifier(_Table(table), Memory()), ids))
    assert {r[3]["memory_action"] for r in reference} == {KEPT, INSIDE, SHRUNK}
    # a run that stops after 25 committed certificates (the 26th is in flight: its
    # memory entry is staged but never reaches the database, like its certificate)
    store = ResultStore(path)
    state = RunState(store.state_records("run", "m", "s"))
    first = one_by_one(MemoryCertifier(_Table(table), Memory(), state), ids)
    done = []
    for _ in range(25):
        i, claim = next(first)
        cert = Certificate(i, claim.prediction, claim.radius, claim.p_lower, 1.0, 0.001)
        store.add_certificate("run", "m", "s", 0, 0, cert, state=state.take())
        done.append((i, claim))
    next(first)
    store.close()
    # resumed: a fresh memory restored from the database certifies the 35 missing inputs
    store = ResultStore(path)
    records = store.state_records("run", "m", "s")
    assert [r.seq for r in records] == list(range(25))
    memory = Memory()
    assert restore(memory, records) == 25
    rest = one_by_one(MemoryCertifier(_Table(table), memory, RunState(records)), ids[25:])
    assert results(done) + results(rest) == reference
    # another setting of the same run is another memory
    assert store.state_records("run", "m", "other") == []
    store.close()
