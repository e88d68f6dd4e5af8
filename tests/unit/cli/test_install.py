"""The install path a migrating operator takes: a wheel built from this checkout (``tox -e build`` builds the
release pair; here pip builds the wheel from the checkout, offline), installed into a fresh virtual environment
(its dependencies from this one's site-packages, after its own, as an air-gapped server gets them from a
wheelhouse), where the
package imports from that environment, its entry points are registered, and ``check`` runs."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

from opentelemetry_instrumentation_vllm_ascend.version import __version__

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGE = "opentelemetry_instrumentation_vllm_ascend"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the built wheel, the fresh environment's python) once per module."""
    # Built without isolation, from this environment's packaging: setuptools reads the PEP 639 license with
    # packaging.licenses (packaging >= 24.2; the package itself needs only its floor, 21, at run time).
    pytest.importorskip("packaging.licenses", reason="building without isolation needs packaging >= 24.2")
    base = tmp_path_factory.mktemp("install")
    # What the sdist holds, copied: setuptools builds in the source tree (build/, *.egg-info), never the checkout's.
    source = base / "source"
    shutil.copytree(ROOT / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    wheels = base / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, cwd=base, timeout=300)
    (wheel,) = wheels.glob(f"{PACKAGE}-{__version__}-*.whl")
    environment = base / "venv"
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    # Its dependencies: this environment's site-packages, after its own (a wheelhouse would do it offline).
    own = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=base).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    pathlib.Path(own, "dependencies.pth").write_text(deps + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*install, "--ignore-installed", str(wheel)], check=True, cwd=base, timeout=300)
    return wheel, python


def _run(python, *code_or_args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    return subprocess.run([str(python), *code_or_args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_the_package_alone(installed):
    wheel, _ = installed
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {PACKAGE, f"{PACKAGE}-{__version__}.dist-info"}  # no tests, no benchmarks


def test_the_installed_package_imports_from_the_new_environment_with_its_entry_points(installed, tmp_path):
    _, python = installed
    probe = (
        "import json, importlib.metadata as m, opentelemetry_instrumentation_vllm_ascend as p;"
        "eps = {g: sorted(e.name for e in m.entry_points(group=g) if e.value.startswith(p.__name__))"
        " for g in ('opentelemetry_instrumentor', 'vllm.general_plugins')};"
        "print(json.dumps({'file': p.__file__, 'version': p.__version__, 'entry_points': eps}))"
    )
    done = _run(python, "-c", probe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["file"].startswith(str(python.parent.parent)) and found["version"] == __version__
    assert found["entry_points"] == {
        "opentelemetry_instrumentor": ["vllm_ascend"],
        "vllm.general_plugins": ["opentelemetry_vllm_ascend"],
    }


def test_check_runs_in_the_new_environment(installed, tmp_path):
    _, python = installed
    done = _run(python, "-m", PACKAGE, "check", "--json", cwd=tmp_path)
    report = json.loads(done.stdout)
    assert report["package"] == __version__ and report["targets"], done.stderr
    assert done.returncode == (0 if report["ok"] else 1)
