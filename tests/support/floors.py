"""The declared lower bounds of pyproject.toml as pip constraints, for ``tox -e floors``.

pyproject.toml is the one place the floors live: this module reads them at run time, so the floors environment
cannot drift from them. Pinned, each at its ``>=`` version: every runtime dependency, and the OpenTelemetry
packages of the ``test`` extra (they move in lockstep with the SDK, so their floors must agree with its floor or the
environment does not resolve). The rest of the test extra (pytest, hypothesis, …) resolves to its newest release.

    python -m tests.support.floors floors.txt      # then: pip install -c floors.txt '.[test]'
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*>=\s*([^,;\s]+)\s*(?:[;#].*)?$")


def _floor(requirement: str) -> tuple[str, str]:
    match = _FLOOR.match(requirement)
    if match is None:
        raise ValueError(f"pyproject.toml: {requirement!r} is not of the form 'name >= version'")
    return match.group(1).lower().replace("_", "-"), match.group(2)


def floors(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{distribution name: its declared floor}, for the runtime dependencies and the test extra's OTel packages."""
    project = tomllib.loads(pyproject.read_text())["project"]
    out = dict(_floor(r) for r in project["dependencies"])
    for requirement in project["optional-dependencies"]["test"]:
        name, version = _floor(requirement)
        if name.startswith("opentelemetry-"):
            out[name] = version
    return out


def constraints(pyproject: Path = PYPROJECT) -> str:
    return "".join(f"{name}=={version}\n" for name, version in sorted(floors(pyproject).items()))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(constraints())
    else:
        sys.stdout.write(constraints())
