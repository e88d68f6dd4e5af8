"""Remote KV connectors' transfers and failures, through vLLM's own stats containers (NIXL and Mooncake,
vLLM 0.23-0.33), hooked by the real installer on the installed vLLM. Oracle: the numbers vLLM's container
itself kept from the same calls (what ``vllm:nixl_*`` and Mooncake's "KV Transfer metrics" log line are made
from) and the values computed by hand."""

from types import SimpleNamespace

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.state import STATE

nixl = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats")
mooncake = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats")

P = catalogue.PREFIX


def labels(phase, connector, direction="remote"):
    return {"dp": "0", "role": "mixed", "phase": phase, "direction": direction, "connector": connector}


def telemetry(total_bytes, xfer_us, descs):
    """nixlXferTelemetry's fields that vLLM's record_transfer reads (NIXL reports durations in µs)."""
    return SimpleNamespace(totalBytes=total_bytes, xferDuration=xfer_us, postDuration=7, descCount=descs)


def test_nixl_transfers_and_failures_match_vllms_own_stats(instrumentation):
    metrics = instrumentation
    stats = nixl.NixlKVConnectorStats()
    STATE.last_step_phase = "decode"  # the step whose get_finished polled the transfers
    stats.record_transfer(telemetry(65536, 1500, 4))
    stats.record_transfer(telemetry(32768, 500, 2))
    stats.record_transfer(None)  # vLLM 0.32+: no telemetry, nothing recorded by vLLM either
    stats.record_failed_transfer()
    ours = labels("decode", "NixlConnector")
    assert metrics.value(P + "kv_transfer:bytes", **ours) == sum(stats.data["bytes_transferred"]) == 98304
    assert metrics.value(P + "kv_transfer:count", **ours) == len(stats.data["bytes_transferred"]) == 2
    count, seconds, _ = metrics.value(P + "kv_transfer:duration", **ours)
    assert count == 2 and seconds == pytest.approx(sum(stats.data["transfer_duration"])) == pytest.approx(0.002)
    assert metrics.value(P + "kv_transfer:failures", **ours) == len(stats.data["num_failed_transfers"]) == 1
    assert metrics.value(P + "kv_transfer:blocking:duration", **ours) is None  # asynchronous: nothing blocks


def test_mooncake_sends_and_failures_match_vllms_own_stats(instrumentation):
    metrics = instrumentation
    stats = mooncake.MooncakeKVConnectorStats()
    STATE.last_step_phase = "prefill"  # not the sender thread's: its transfers belong to no step
    stats.record_transfer(duration_s=0.25, total_bytes=4096, num_descs=8)  # as _send_blocks calls it
    stats.record_transfer(0.125, 1024, 2)
    stats.record_failed_transfer()
    stats.record_failed_recv()
    stats.record_failed_recv()
    ours = labels("unknown", "MooncakeConnector")
    assert metrics.value(P + "kv_transfer:bytes", **ours) == sum(stats.data["bytes_transferred"]) == 5120
    assert metrics.value(P + "kv_transfer:count", **ours) == len(stats.data["transfer_duration"]) == 2
    count, seconds, _ = metrics.value(P + "kv_transfer:duration", **ours)
    assert (count, seconds) == (2, sum(stats.data["transfer_duration"])) == (2, 0.375)
    failed = len(stats.data["num_failed_transfers"]) + len(stats.data["num_failed_recvs"])
    assert metrics.value(P + "kv_transfer:failures", **ours) == failed == 3
    assert metrics.value(P + "kv_transfer:bytes", **labels("prefill", "MooncakeConnector")) is None


def test_disabled_kv_transfer_group_leaves_the_stats_unhooked(metrics, monkeypatch):
    from tests.conftest import instrumented

    monkeypatch.setenv("OTEL_VLLM_ASCEND_DISABLED_METRICS", "kv_transfer:*")
    original = nixl.NixlKVConnectorStats.record_transfer
    with instrumented(monkeypatch):
        assert nixl.NixlKVConnectorStats.record_transfer is original
        stats = nixl.NixlKVConnectorStats()
        stats.record_transfer(telemetry(10, 10, 1))
        stats.record_failed_transfer()
        assert stats.data["bytes_transferred"] == [10]
    assert metrics.value(P + "kv_transfer:bytes", **labels("unknown", "NixlConnector")) is None
    assert metrics.points().get(P + "kv_transfer:failures", {}) == {}
