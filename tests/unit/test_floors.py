"""The floors environment (``tox -e floors``) installs exactly pyproject.toml's declared lower bounds: its pip
constraints come from ``tests.support.floors``, which reads them from pyproject.toml at run time (the one place
they live). These rules keep that true: every dependency has a floor, the constraints pin each at it, the tox
environment installs through them, and the OpenTelemetry floors agree with one another."""

from __future__ import annotations

import configparser
import pathlib
import re

from packaging.requirements import Requirement

from tests.support import floors

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _tox(env):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser[f"testenv:{env}"]


def test_every_runtime_dependency_declares_a_floor_and_the_constraints_pin_it_there():
    declared = {}
    for line in _project()["dependencies"]:
        requirement = Requirement(line)
        lower = [s.version for s in requirement.specifier if s.operator == ">="]
        assert len(lower) == 1, f"{line!r}: a runtime dependency needs exactly one '>=' floor"
        declared[requirement.name.lower().replace("_", "-")] = lower[0]
    pinned = dict(line.split("==") for line in floors.constraints().splitlines())
    assert {name: pinned.get(name) for name in declared} == declared
    # and nothing else but the test extra's OpenTelemetry packages, each at its declared floor
    test_extra = {
        Requirement(line).name: str(Requirement(line).specifier) for line in _project()["optional-dependencies"]["test"]
    }
    extra = {name: version for name, version in pinned.items() if name not in declared}
    assert extra == {
        name: spec.removeprefix(">=") for name, spec in test_extra.items() if name.startswith("opentelemetry-")
    }


def test_the_opentelemetry_floors_are_one_release_train():
    """API, SDK, exporter and proto share a version 1.N; the instrumentation and test-utils packages of that
    release are 0.(N+21)bP for the API's 1.N.P. Floors off the train do not resolve together (or resolve to a newer SDK)."""
    pinned = floors.floors()
    stable = {name: v for name, v in pinned.items() if name.startswith("opentelemetry-") and not v.startswith("0.")}
    contrib = {name: v for name, v in pinned.items() if name.startswith("opentelemetry-") and v.startswith("0.")}
    assert len(set(stable.values())) == 1, stable
    (release,) = set(stable.values())
    minor, patch = (int(part) for part in (release.split(".") + ["0"])[1:3])
    assert set(contrib.values()) == {f"0.{minor + 21}b{patch}"}, contrib


def test_the_floors_environment_installs_through_the_generated_constraints():
    env = _tox("floors")
    assert env["skip_install"].strip() == "true"  # tox's own install would resolve to the newest releases
    steps = [line.strip() for line in env["commands_pre"].strip().splitlines()]
    out = re.fullmatch(r"python -m tests\.support\.floors (\S+)", steps[0])
    assert out, steps[0]
    assert steps[1] == f"python -m pip install -q -c {out.group(1)} .[test]"
    # neither environment brings vLLM or torch: what needs them skips
    for name in ("floors", "newest"):
        assert "cpu" not in _tox(name).get("extras", "").split(), name


def test_the_readme_test_command_runs_both_environments():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    env_list = [e.strip() for e in parser["tox"]["env_list"].replace(",", " ").split()]
    assert {"floors", "newest"} <= set(env_list), env_list


def test_a_dependency_without_a_floor_stops_the_constraints(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["wrapt"]\n[project.optional-dependencies]\ntest = []\n')
    try:
        floors.constraints(pyproject)
    except ValueError as error:
        assert "'wrapt'" in str(error)
    else:
        raise AssertionError("a dependency without a floor gave constraints")
    pyproject.write_text(
        "[project]\ndependencies = [\"wrapt >= 1.15; python_version >= '3.10'\"]\n[project.optional-dependencies]\ntest = []\n"
    )
    assert floors.constraints(pyproject) == "wrapt==1.15\n"
