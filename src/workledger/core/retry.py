"""Retry policy: capped exponential backoff with jitter, as a pure function."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay: float = 1.0  # seconds before the second attempt (before jitter)
    max_delay: float = 300.0  # cap
    jitter: float = 0.5  # fraction of the delay that is randomised

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must not be negative")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")


def backoff_delay(attempt: int, policy: RetryPolicy, draw: float) -> float:
    """Delay in seconds after failed attempt number ``attempt`` (1-based).

    ``draw`` in [0, 1) is supplied by the caller; the delay lies in
    ``[d * (1 - jitter), d]`` where ``d = min(max_delay, base_delay * 2 ** (attempt - 1))``.

    >>> backoff_delay(3, RetryPolicy(base_delay=1, max_delay=60, jitter=0), 0.7)
    4.0
    """
    exponent = min(max(attempt - 1, 0), 62)
    capped = min(policy.max_delay, policy.base_delay * float(2**exponent))
    return capped * (1.0 - policy.jitter * draw)
