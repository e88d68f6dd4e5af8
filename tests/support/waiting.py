"""Polling for the tests: wait for a condition, never for a fixed time."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float, step: float = 1.0):
    """Call ``predicate`` every ``step`` seconds until it returns something true or ``timeout`` seconds have
    passed; returns its last value (false: it timed out)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)
