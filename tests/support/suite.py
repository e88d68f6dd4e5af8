"""The py environment's test command (``tox``, ``tox -e py``, ``.ci/run``).

Without arguments: the tests that start no server on every core (``pytest -n auto --dist loadfile``: a module's
tests stay in one process, where they share its fixtures), then the e2e tests one at a time (one vLLM server at a
time; a module's tests share its start-up). Both run, whatever the first gives; the exit status is the worse.
With arguments (``tox -e py -- tests/unit -q``): one ``pytest`` with exactly those.

    python -m tests.support.suite [pytest arguments]
"""

from __future__ import annotations

import subprocess
import sys

UNIT = ["-n", "auto", "--dist", "loadfile", "-m", "not e2e", "-ra", "--durations=15"]
E2E = ["-m", "e2e", "-ra", "--durations=25"]


def commands(args: list[str]) -> list[list[str]]:
    pytest = [sys.executable, "-m", "pytest"]
    if args:
        return [pytest + args]
    return [pytest + UNIT, pytest + E2E]


def main(args: list[str]) -> int:
    status = 0
    for command in commands(args):
        print("suite:", " ".join(command[1:]), flush=True)
        status = max(status, subprocess.call(command))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
