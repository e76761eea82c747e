"""The API's rate limits: one token bucket per key (a tenant, or the source address of
requests without a valid token), on an injected clock."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.config import RateLimit


@dataclass
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; a request takes one."""

    rate: float
    burst: float
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """0 when allowed (a token taken), else the seconds until a token is there."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass
class RateLimiter:
    """One token bucket per tenant; the clock is injected (monotonic seconds)."""

    limit: RateLimit
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def retry_after(self, tenant: str) -> int | None:
        """None when the request may go on, else whole seconds to wait (at least 1)."""
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            burst = float(self.limit.burst)
            bucket = self._buckets[tenant] = TokenBucket(
                self.limit.requests_per_second, burst, burst, now
            )
        wait = bucket.take(now)
        return None if wait == 0 else max(1, math.ceil(wait))

    def prune(self, most: int) -> None:
        """Past ``most`` buckets, forget the ones full again (idle long enough that a fresh
        bucket is the same), so keys from many addresses cannot grow memory without end."""
        if len(self._buckets) <= most:
            return
        now = self.clock()
        for key, bucket in list(self._buckets.items()):
            if bucket.tokens + max(0.0, now - bucket.at) * bucket.rate >= bucket.burst:
                del self._buckets[key]


__all__ = ["RateLimiter", "TokenBucket"]
