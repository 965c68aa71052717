"""What one certificate row may hold: integers SQLite stores, evidence of a bounded size.

A certificate's claim comes from a certifier, third-party code; the harness checks it
(:func:`harness.certification.certify.checked_claims`, naming the certifier), and the store
refuses the rest itself before SQLite sees it (:func:`stored_evidence`), so that a bad
value fails its row with a message rather than an ``OverflowError`` from ``sqlite3`` or a
database grown by megabytes per row:

- integers lie in SQLite's 64-bit range (:data:`INT64_MIN`, :data:`INT64_MAX`);
- a claim's evidence is strict JSON (no NaN or infinity: what the run export carries) of
  at most :data:`EVIDENCE_BYTES` bytes.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.foundation.errors import IdrsError

if TYPE_CHECKING:
    from harness.foundation.certificate import Certificate
    from harness.foundation.runstate import StateRecord

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""The integers an SQLite INTEGER column holds."""
EVIDENCE_BYTES = 16 * 1024
"""The most bytes of JSON a claim's evidence may take. The built-in certifiers' evidence
takes under 1 KiB (a few numbers, a memory's ids); 16 KiB leaves room for a per-input
vector of some thousand numbers, while a row of 10,000 inputs stores at most 160 MiB of
it (and a plugin host's answer to a chunk of claims stays small:
harness.plugin.hosting.in_harness.limits)."""


def jsonable(value: Any) -> Any:
    """numpy scalars and arrays, tensors and the like as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def evidence_json(evidence: Any) -> str:
    """``evidence`` as the store writes it (JSON); a :class:`ValueError` saying why when it
    is not strict JSON or takes more than :data:`EVIDENCE_BYTES` bytes."""
    try:
        text = json.dumps(evidence, default=jsonable, allow_nan=False)
    except ValueError:
        raise ValueError("it holds a NaN or an infinity, which is not JSON") from None
    except (TypeError, RecursionError) as exc:
        raise ValueError(f"it is not JSON data ({exc})") from None
    if len(text) > EVIDENCE_BYTES:
        raise ValueError(f"it takes {len(text)} bytes of JSON, past the limit of "
                         f"{EVIDENCE_BYTES} bytes per claim (EVIDENCE_BYTES)")  # fmt: skip
    return text


def in_int64(value: Any) -> bool:
    """Whether ``value`` is an integer (not a bool) an SQLite INTEGER column holds."""
    if isinstance(value, bool):
        return False
    try:
        return INT64_MIN <= operator.index(value) <= INT64_MAX
    except TypeError:
        return False


def stored_evidence(cert: Certificate, label: int, state: Sequence[StateRecord]) -> str:
    """The evidence of ``cert`` as the store writes it (:func:`evidence_json`), once its
    integers, its ``label``'s and its ``state`` records' are known to fit SQLite's: an
    :class:`IdrsError` naming the input and the value otherwise, before anything is written."""
    integers = [("input id", cert.input_id), ("label", label), ("prediction", cert.prediction),
                ("PREDICT class", cert.predict), *(("state record", r.seq) for r in state)]  # fmt: skip
    for what, value in integers:
        if not in_int64(value):
            raise IdrsError(f"the certificate of input {cert.input_id!r:.40} has {what} "
                            f"{value!r:.40}, not an integer that SQLite stores (64-bit)")  # fmt: skip
    try:
        return evidence_json(cert.evidence)
    except ValueError as exc:
        raise IdrsError(f"the evidence of input {cert.input_id}'s certificate cannot be "
                        f"stored: {exc}") from None  # fmt: skip
