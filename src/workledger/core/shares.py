"""Fair shares: which tenant a claim is for (docs/design.md, "Claim order").

Among the runs of one priority, claims rotate across the tenants that have claimable work,
each tenant's share of the claims in proportion to its weight. :class:`Shares` is a smooth
weighted round robin (the one nginx balances upstreams with): every claim, each tenant in the
rotation gains its weight in credit, the one claimed for gives up the sum of the weights, and
the tenant with the most credit goes first. Over any ``W`` consecutive claims (``W``: the sum
of the weights) a tenant of weight ``w`` gets exactly ``w``, spread out rather than in a burst.

A tenant found with nothing claimable (its items in flight, waiting for a retry, held back)
leaves the rotation for that claim and loses its credit: it banks nothing while idle, so a
tenant that comes back gets its share from then on, not a burst for the time it was away.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

T = TypeVar("T", bound=Hashable)


class Shares:
    """The credit of each tenant (any hashable key) of one claim loop."""

    def __init__(self) -> None:
        self.credit: dict[Hashable, int] = {}

    def order(self, weights: Mapping[T, int]) -> list[T]:
        """The tenants of ``weights`` (in their listed order) in the order to try them: the
        most credit after this claim's gain first, ties in listed order."""
        credit = self.credit
        return sorted(weights, key=lambda t: -(credit.get(t, 0) + weights[t]))

    def charge(self, chosen: T, weights: Mapping[T, int], idle: set[T]) -> None:
        """The claim went to ``chosen``; ``idle``: the tenants tried before it that had nothing
        claimable. The others gain their weight, ``chosen`` gives up the sum; tenants no
        longer listed are forgotten."""
        credit = self.credit
        for gone in [t for t in credit if t not in weights or t in idle]:
            del credit[gone]
        active = {t: w for t, w in weights.items() if t not in idle}
        for t, w in active.items():
            credit[t] = credit.get(t, 0) + w
        credit[chosen] = credit.get(chosen, 0) - sum(active.values())

    def forget(self, tenants: set[T]) -> None:
        """Nothing was claimable for any of ``tenants``: they bank nothing."""
        for t in tenants:
            self.credit.pop(t, None)
