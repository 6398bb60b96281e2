"""The one retry policy every backend follows: when a failed shard is tried again, and after how long.

A shard gets `backend.max_retries` extra tries, always with the same keys (so a
retried shard returns the very data a first try would). Between tries the
policy waits an exponential backoff with jitter (`backend.retry_backoff_s`
doubling per try, capped at `backend.retry_backoff_max_s`, drawn in
`[ceiling / 2, ceiling]`), so shards that failed together do not all come back
at the same instant. An HTTP answer 429 or 503 with a `Retry-After` header
(seconds or an HTTP date) makes the wait at least that long, capped at
`retry_after_max_s`. A `Failure` marked not retryable (a request that is wrong
in itself) ends the tries at once.

`allows` and `wait_s` are the whole decision. `call` and `call_async` run a
try function under tenacity with exactly those two; the Ray backend, which
polls futures instead of blocking in a loop, calls them directly.
"""
from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from datetime import timezone
from typing import Any, Awaitable, Callable, NamedTuple, Optional

from tenacity import (AsyncRetrying, RetryCallState, Retrying, wait_exponential,
                      wait_random_exponential)

from jaxrl_dist.config import BackendConfig

RETRY_AFTER_CODES = (429, 503)  # the answers whose Retry-After says when to come back
RETRY_AFTER_MAX_S = 30.0  # a server asking for longer than this gets this (a run must not stall)


class Failure(Exception):
    """One failed try, as a backend reports it to the policy: a one-line reason,
    whether another try can help, and the wait the server asked for (if any)."""

    def __init__(self, why: str, retryable: bool = True, retry_after_s: Optional[float] = None):
        super().__init__(why)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class GaveUp(Exception):
    """Every allowed try failed (or one failed that no retry can help): `tries`
    made, the last `error`. Backends turn it into their own `BackendError` line."""

    def __init__(self, tries: int, error: BaseException):
        super().__init__(f"failed after {self.count(tries)}: {error}")
        self.tries = tries
        self.error = error

    @staticmethod
    def count(tries: int) -> str:
        return f"{tries} {'try' if tries == 1 else 'tries'}"


class Outcome(NamedTuple):
    """A try function's value and the retries it took (0: the first try worked)."""

    value: Any
    retries: int


def retry_after_s(response, now: Optional[float] = None) -> Optional[float]:
    """Seconds a 429 or 503 `response` asks the client to wait (its `Retry-After`,
    in seconds or as an HTTP date); None for other codes or a missing or
    unreadable header. `response` has `status_code` and case-insensitive `headers`
    (an `httpx.Response`)."""
    if response.status_code not in RETRY_AFTER_CODES:
        return None
    value = (response.headers.get("retry-after") or "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _state(tries: int) -> RetryCallState:
    """A tenacity call state after `tries` tries (what its wait strategies read)."""
    state = RetryCallState(None, None, (), {})
    state.attempt_number = tries
    return state


_DEFAULTS = BackendConfig()  # the config's defaults (its class holds no values: it has slots)


@dataclass(frozen=True)
class RetryPolicy:
    """`max_retries` extra tries of a failed shard, and the waits between them."""

    max_retries: int = _DEFAULTS.max_retries
    backoff_s: float = _DEFAULTS.retry_backoff_s  # the ceiling of the first wait; it doubles each try ...
    backoff_max_s: float = _DEFAULTS.retry_backoff_max_s  # ... up to this
    retry_after_max_s: float = RETRY_AFTER_MAX_S

    @classmethod
    def from_config(cls, cfg) -> "RetryPolicy":
        """The policy of a `BackendConfig`."""
        return cls(cfg.max_retries, cfg.retry_backoff_s, cfg.retry_backoff_max_s)

    # -- the decision ------------------------------------------------------

    def allows(self, tries: int, error: BaseException) -> bool:
        """Whether another try may follow `tries` failed tries, the last ending in `error`."""
        if not isinstance(error, Exception):  # an interrupt or a cancelled task is not a failure
            return False
        if isinstance(error, Failure) and not error.retryable:
            return False
        return tries <= self.max_retries

    def backoff(self, tries: int) -> float:
        """The jittered backoff after `tries` failed tries: in `[ceiling / 2, ceiling]`,
        ceiling `min(backoff_s * 2 ** (tries - 1), backoff_max_s)`."""
        # equal jitter: a fixed half (the wait keeps growing) plus a random draw of up
        # to the other half (shards that failed together come back apart)
        half, cap = self.backoff_s / 2, self.backoff_max_s / 2
        wait = wait_exponential(multiplier=half, max=cap) + wait_random_exponential(multiplier=half, max=cap)
        return wait(_state(tries))

    def wait_s(self, tries: int, error: BaseException) -> float:
        """Seconds to wait after `tries` failed tries, the last ending in `error`."""
        wait = self.backoff(tries)
        asked = error.retry_after_s if isinstance(error, Failure) else None
        if asked is not None:
            wait = max(wait, min(asked, self.retry_after_max_s))
        return wait

    # -- tenacity ----------------------------------------------------------

    def _tenacity(self) -> dict:
        # every failure goes to `stop`, which asks `allows`; reraise: the try's own error
        return {"retry": lambda rs: rs.outcome.failed,
                "stop": lambda rs: not self.allows(rs.attempt_number, rs.outcome.exception()),
                "wait": lambda rs: self.wait_s(rs.attempt_number, rs.outcome.exception()),
                "reraise": True}

    def call(self, fn: Callable[[int], Any]) -> Outcome:
        """`fn(try_index)` until it returns; `GaveUp` when the policy ends the tries."""
        tries = 0
        try:
            for attempt in Retrying(**self._tenacity()):
                with attempt:
                    tries = attempt.retry_state.attempt_number
                    value = fn(tries - 1)
        except Exception as err:
            raise GaveUp(tries, err) from err
        return Outcome(value, tries - 1)

    async def call_async(self, fn: Callable[[int], Awaitable[Any]]) -> Outcome:
        """`call` for a coroutine function; the waits are `asyncio.sleep`s."""
        tries = 0
        try:
            async for attempt in AsyncRetrying(**self._tenacity()):
                with attempt:
                    tries = attempt.retry_state.attempt_number
                    value = await fn(tries - 1)
        except Exception as err:
            raise GaveUp(tries, err) from err
        return Outcome(value, tries - 1)


__all__ = ["RetryPolicy", "Failure", "GaveUp", "Outcome", "retry_after_s", "RETRY_AFTER_CODES",
           "RETRY_AFTER_MAX_S"]
