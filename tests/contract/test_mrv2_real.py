"""vLLM 0.34's (and 0.30's, which vllm-ascend 0.30.0rc2's V2 NPU runner subclasses) real model runner V2 modules, in
a child process: the release's pure-Python package (from its sdist,
``source_archives``) on ``sys.path`` with a ``vllm-VERSION+cpu`` dist-info beside it, over the installed CPU torch.
The real installer gates model runner V1's rows off (0.34 removed it) and resolves every V2 and standalone-CPU row
on the real classes (the generated wrappers built from their real signatures); the real ``StepTimingCollector``,
hooked, opens the forward of a step in progress, does nothing outside one, and keeps its own behaviour. A real
forward needs CUDA (V2's GPUModelRunner); tests/contract/test_mrv2.py checks the call order in the source."""

import json
import os
import subprocess
import sys
import tarfile

import pytest

from tests.support.source_archives import sdist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _unpacked(tmp_path_factory, version: str) -> str:
    pytest.importorskip("torch")
    directory = tmp_path_factory.mktemp(f"vllm-{version}")
    with tarfile.open(sdist("vllm", version)) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(f"vllm-{version}/vllm/") and m.isfile()]
        for member in members:
            member.name = member.name[len(f"vllm-{version}/") :]
        archive.extractall(directory, members=members, filter="data")
    info = directory / f"vllm-{version}+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    return str(directory)


@pytest.fixture(scope="module")
def vllm_034(tmp_path_factory):
    return _unpacked(tmp_path_factory, "0.34.0")


def _drive(directory: str) -> dict:
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([directory, ROOT]), VLLM_NO_USAGE_STATS="1")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "support", "mrv2_real_drive.py")],
        env=environ,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_the_real_030_model_runner_v2_modules_are_hooked_with_the_forward_mark(tmp_path_factory):
    """vLLM 0.30 (what vllm-ascend 0.30.0rc2's V2 NPU runner subclasses): the real installer resolves V2's rows, the
    forward mark included (gated from 0.30), on its real modules, and the real collector opens our forward."""
    result = _drive(_unpacked(tmp_path_factory, "0.30.0"))
    assert result["vllm"] == "0.30.0+cpu"
    status = result["status"]
    v2 = {
        s: v
        for s, v in status.items()
        if s.startswith(("vllm.v1.worker.gpu.model_runner:", "vllm.v1.worker.gpu.async"))
    }
    assert set(v2.values()) == {"resolved"} and {s.split(":")[1] for s in v2} == {
        "GPUModelRunner.execute_model",
        "GPUModelRunner.sample_tokens",
        "GPUModelRunner.sample",
        "GPUModelRunner.prepare_inputs",
        "StepTimingCollector.forward_start",
    }, v2
    standalone = {s: v for s, v in status.items() if s.startswith("vllm.v1.worker.cpu.standalone_model_runner:")}
    assert len(standalone) == 3 and set(standalone.values()) == {"gated off by version"}
    assert result["marked"] and result["outside"] and result["forward_start_set"] and result["collector_untouched"]


def test_the_real_034_model_runner_v2_modules_are_hooked(vllm_034):
    result = _drive(vllm_034)
    assert result["vllm"] == "0.34.0+cpu"
    status = result["status"]
    mrv1 = {s: v for s, v in status.items() if s.startswith("vllm.v1.worker.gpu_model_runner:")}
    assert len(mrv1) == 4 and set(mrv1.values()) == {"gated off by version"}
    others = {s: v for s, v in status.items() if s not in mrv1}
    assert len(others) == 8 and set(others.values()) == {"resolved"}, others
    assert result["marked"] and result["outside"] and result["forward_start_set"] and result["collector_untouched"]
