"""S5: memory certificates are their own category (Súkeník et al. 2022, App. C.2).

A memory (Alfarra et al. 2022, Alg. 3) adjusts each certificate to those issued before
it, so its radii certify no fixed smoothed classifier and change with the order of the
inputs. Such a row is never ``sound``: this check replays the stored certificates over
``budget.orders`` random input orders (``certifier.order_spread``, seeded from the
audit's entropy), reports the spread
of the certified accuracy and ACR, and keeps the certificates of the order with the
lowest ACR, at which the leaderboard scores the row. Its verdict is ``order-dependent``.

Applicability: the certifier declares ``order_dependent = True``; otherwise
``not-applicable``.
"""

from __future__ import annotations

from harness.audit.audit import Audit
from harness.foundation.verdict import CheckResult, Verdict

NAME = "memory-order"


def check_order(audit: Audit) -> CheckResult:
    certifier = audit.certifier
    if not certifier.order_dependent:
        return CheckResult(NAME, Verdict.NOT_APPLICABLE,
                           "certificates do not depend on the order of inputs (order_dependent = False)")  # fmt: skip
    certs = audit.certificates
    inputs = {int(c["input_id"]): x for c, x in zip(certs, audit.inputs.cpu(), strict=True)}
    radii = list(audit.radii) or [0.5]
    spread = certifier.order_spread(certs, inputs, audit.budget.orders, radii,
                                     audit.seed(f"{NAME}/orders"))  # fmt: skip
    acr = spread["acr"]
    k = len(radii) // 2
    evidence = {key: spread[key] for key in ("orders", "radii", "min", "median", "max", "recorded",
                                             "acr", "worst_order")}  # fmt: skip
    summary = (
        f"memory certificates depend on the input order (not a fixed classifier, Súkeník et al. "
        f"App. C.2): over {spread['orders']} orders ACR {acr['min']:.4f}–{acr['max']:.4f} "
        f"(median {acr['median']:.4f}), certified accuracy at {radii[k]:g} "
        f"{spread['min'][k]:.4f}–{spread['max'][k]:.4f}; scored at the worst order"
    )
    return CheckResult(NAME, Verdict.ORDER_DEPENDENT, summary, evidence, ["order-dependent"])
