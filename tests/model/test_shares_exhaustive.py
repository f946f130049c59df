"""The fair-share rotation (core/shares.py), explored exhaustively over small worlds: every
weight vector of up to four tenants from {1, 2, 3, 5}, and every pattern of tenants with and
without claimable work over a horizon (7 claims for two tenants, 3 for three). The worker drives
:class:`Shares` exactly as :func:`claim` does here (worker.py ``_claim_next``): try the
tenants in ``order``, a tenant with nothing claimable is idle for that claim, ``charge`` the
one claimed for, ``forget`` the idle ones when nobody had anything.

What holds, and is checked in every world:

- a claim goes to a tenant that has claimable work, and to none only when none has any;
- while every tenant has work, each ``W`` consecutive claims (``W``: the sum of the weights)
  give a tenant of weight ``w`` exactly ``w`` of them, and any ``L`` consecutive claims give
  it within 1.5 of ``w * L / W``;
- after any pattern of tenants idle and back, once all have work again every ``W``
  consecutive claims give each its exact weight: an idle tenant banks nothing, and nobody
  owes anything to a tenant that was away.
"""

from __future__ import annotations

import itertools

import pytest

from workledger.core.shares import Shares

pytestmark = pytest.mark.unit

WEIGHTS = (1, 2, 3, 5)


def claim(shares: Shares, weights: dict[str, int], active: set[str]) -> str | None:
    idle: set[str] = set()
    for tenant in shares.order(weights):
        if tenant in active:
            shares.charge(tenant, weights, idle)
            return tenant
        idle.add(tenant)
    shares.forget(idle)
    return None


def run(weights: dict[str, int], pattern: list[set[str]]) -> list[str | None]:
    shares = Shares()
    return [claim(shares, weights, active) for active in pattern]


def worlds(most: int = 4) -> list[dict[str, int]]:
    return [{f"t{i}": w for i, w in enumerate(ws)}
            for n in range(1, most + 1) for ws in itertools.product(WEIGHTS, repeat=n)]


def test_with_work_everywhere_each_tenant_gets_its_weight_in_every_window() -> None:
    checked = 0
    for weights in worlds():
        total = sum(weights.values())
        out = run(weights, [set(weights)] * (3 * total))
        for start in range(len(out) - total + 1):
            window = out[start:start + total]
            assert {t: window.count(t) for t in weights} == weights, (weights, out)
        for length in range(1, 2 * total):
            for start in range(len(out) - length + 1):
                window = out[start:start + length]
                for t, w in weights.items():
                    assert abs(window.count(t) - w * length / total) <= 1.5, (weights, out)
        checked += 1
    assert checked == sum(len(WEIGHTS) ** n for n in range(1, 5))


@pytest.mark.parametrize("tenants,horizon", [(2, 7), (3, 3)])
def test_after_any_pattern_of_idle_tenants_the_shares_are_exact_again(
        tenants: int, horizon: int) -> None:
    explored = 0
    for weights in [w for w in worlds(tenants) if len(w) == tenants and max(w.values()) <= 3]:
        names = list(weights)
        subsets = [set(c) for r in range(tenants + 1) for c in itertools.combinations(names, r)]
        total = sum(weights.values())
        for steps in itertools.product(subsets, repeat=horizon):
            pattern = [*steps, *[set(names)] * (3 * total)]
            out = run(weights, pattern)
            for active, chosen in zip(pattern, out, strict=True):
                assert (chosen is None) == (not active) and (chosen is None or chosen in active)
            tail = out[horizon:]
            for start in range(len(tail) - total + 1):
                window = tail[start:start + total]
                assert {t: window.count(t) for t in weights} == weights, (weights, steps, out)
            explored += 1
    assert explored == 3 ** tenants * (2 ** tenants) ** horizon  # every world, every pattern
