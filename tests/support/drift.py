"""The drift canary (``tox -e drift``): the newest vLLM and vllm-ascend releases on the index pip is configured
with (their PEP 691 project pages; the newest release, pre-releases included: vllm-ascend ships release
candidates for months before a final, and vLLM's candidates come before its final), run through ``check --vllm
NEWEST`` and ``check --vllm-ascend NEWEST`` and through the source contract tests with those releases added to
the supported ones (``OTEL_VLLM_ASCEND_DRIFT_VLLM`` / ``OTEL_VLLM_ASCEND_DRIFT_VLLM_ASCEND``, read by
tests/support/contract.py). A release that moved something we hook is a red run naming the symbols (the summary
lists each check's missing ones; each contract test names its own). Needs no vLLM installed; downloads
one sdist of each (cached in ``OTEL_VLLM_ASCEND_SOURCE_CACHE``). Meant for CI or nightly, not the default
``tox`` run: a new upstream release must not turn an unrelated change red.

``python -m tests.support.drift [--vllm VERSION] [--vllm-ascend VERSION] [pytest options]``: the versions to try
instead of the newest (a release candidate, say)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
#: tests/contract's tests that run vLLM or test the checker's own tools rather than read a release's source.
NOT_SOURCE_ONLY = (
    "test_check_release.py",
    "test_mrv2_real.py",
    "test_real_scheduler.py",
    "test_real_scheduler_versions.py",
    "test_source_archives.py",
    "test_traces_v023.py",
)

#: The contract tests: source only, no vLLM import (test_paths and test_kv_transfer drive the installed vLLM).
CONTRACT = sorted(
    f"tests/contract/{name}"
    for name in os.listdir(os.path.join(ROOT, "tests", "contract"))
    if name.startswith("test_") and name.endswith(".py") and name not in NOT_SOURCE_ONLY
)


def main(argv=None) -> int:
    from opentelemetry_instrumentation_vllm_ascend import supported
    from opentelemetry_instrumentation_vllm_ascend.cli.release import _vllm_for_ascend
    from tests.support import source_archives

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", help="the vLLM release to try (default: the newest on the index)")
    parser.add_argument("--vllm-ascend", help="the vllm-ascend release to try (default: the newest on the index)")
    args, pytest_args = parser.parse_known_args(argv)
    vllm = args.vllm or source_archives.newest_release("vllm", prereleases=True)
    ascend = args.vllm_ascend or source_archives.newest_release("vllm-ascend", prereleases=True)
    ascend_vllm = _vllm_for_ascend(ascend)
    print(
        f"drift canary: vLLM {vllm} (supported: {', '.join(supported.VLLM)}); vllm-ascend {ascend} over vLLM "
        f"{ascend_vllm} (supported: {', '.join(a for a, _ in supported.VLLM_ASCEND)})",
        flush=True,
    )
    env = {
        **os.environ,
        "OTEL_VLLM_ASCEND_DRIFT_VLLM": vllm,
        "OTEL_VLLM_ASCEND_DRIFT_VLLM_ASCEND": f"{ascend}:{ascend_vllm}",
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p),
    }
    check = [sys.executable, "-m", "opentelemetry_instrumentation_vllm_ascend", "check"]
    codes, named = {}, {}
    for option, version in (("--vllm", vllm), ("--vllm-ascend", ascend)):
        what = f"check {option} {version}"
        codes[what] = subprocess.call([*check, option, version], env=env)
        if codes[what]:
            named[what] = missing_symbols([*check, option, version, "--json"], env)
    codes["contract tests"] = subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args, *CONTRACT], cwd=ROOT, env=env
    )
    for what, code in codes.items():
        symbols = f": missing {', '.join(named[what])}" if named.get(what) else ""
        print(f"drift canary: {what}: {'ok' if code == 0 else f'FAILED (exit {code}){symbols}'}")
    return 0 if not any(codes.values()) else 1


def missing_symbols(command: list[str], env: dict) -> list[str]:
    """The symbols ``check … --json`` reports missing (empty when its report cannot be read)."""
    import json

    done = subprocess.run(command, env=env, capture_output=True, text=True)
    try:
        return [m["symbol"] for m in json.loads(done.stdout)["missing"]]
    except (ValueError, KeyError, TypeError):
        return []


if __name__ == "__main__":
    sys.exit(main())
