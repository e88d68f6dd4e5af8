"""tests/support/suite.py, the py environment's command: what it runs with and without arguments."""

import sys

from tests.support import suite


def test_without_arguments_the_serverless_tests_run_on_every_core_then_the_e2e_tests_alone():
    unit, e2e = suite.commands([])
    assert unit[:3] == [sys.executable, "-m", "pytest"] and e2e[:3] == unit[:3]
    assert unit[3:] == ["-n", "auto", "--dist", "loadfile", "-m", "not e2e", "-ra", "--durations=15"]
    assert e2e[3:] == ["-m", "e2e", "-ra", "--durations=25"]


def test_with_arguments_one_pytest_with_exactly_those():
    assert suite.commands(["tests/unit", "-q"]) == [[sys.executable, "-m", "pytest", "tests/unit", "-q"]]


def test_both_run_and_the_worse_status_wins(monkeypatch):
    ran = []

    def call(command):
        ran.append(command)
        return 1 if len(ran) == 1 else 0

    monkeypatch.setattr(suite.subprocess, "call", call)
    assert suite.main([]) == 1
    assert len(ran) == 2
