"""vLLM 0.34's real model runner V2 modules, in a child process: 0.34's pure-Python package (from its sdist,
``source_archives``) on ``sys.path`` with a ``vllm-0.34.0+cpu`` dist-info beside it, over the installed CPU torch.
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


@pytest.fixture(scope="module")
def vllm_034(tmp_path_factory):
    pytest.importorskip("torch")
    directory = tmp_path_factory.mktemp("vllm-0.34")
    with tarfile.open(sdist("vllm", "0.34.0")) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith("vllm-0.34.0/vllm/") and m.isfile()]
        for member in members:
            member.name = member.name[len("vllm-0.34.0/") :]
        archive.extractall(directory, members=members, filter="data")
    info = directory / "vllm-0.34.0+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0+cpu\n")
    return str(directory)


def test_the_real_034_model_runner_v2_modules_are_hooked(vllm_034):
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([vllm_034, ROOT]), VLLM_NO_USAGE_STATS="1")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "support", "mrv2_real_drive.py")],
        env=environ,
        cwd=vllm_034,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["vllm"] == "0.34.0+cpu"
    status = result["status"]
    mrv1 = {s: v for s, v in status.items() if s.startswith("vllm.v1.worker.gpu_model_runner:")}
    assert len(mrv1) == 4 and set(mrv1.values()) == {"gated off by version"}
    others = {s: v for s, v in status.items() if s not in mrv1}
    assert len(others) == 8 and set(others.values()) == {"resolved"}, others
    assert result["marked"] and result["outside"] and result["forward_start_set"] and result["collector_untouched"]
