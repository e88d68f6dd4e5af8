"""OffloadingConnector transfers through vLLM's own OffloadingConnectorWorker (0.32+): its real
prepare_store_kv / start_kv_transfers / get_finished, wrapped by our hooks, around a stand-in
OffloadingWorker that completes jobs with sizes and times. Oracle: the transfer stats vLLM itself
builds from the same results (``build_connector_worker_meta().transfer_stats``, what
``vllm:kv_offload_{load,store}_bytes`` / ``_time`` / ``_size`` are made from)."""

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.handlers import kv_transfer
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE

offloading = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker")
common = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.offloading.common")
base = pytest.importorskip("vllm.v1.kv_offload.base")

P = catalogue.PREFIX


class StandInWorker:
    """An OffloadingWorker's interface: accepts every job; ``done`` lists what get_finished returns next."""

    def __init__(self):
        self.submitted = []
        self.done = []

    def submit_store(self, job_id, src_spec, dst_spec):
        self.submitted.append(("store", job_id))
        return True

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
        self.submitted.append(("load", job_id))
        return True

    def get_finished(self):
        done, self.done = self.done, []
        return done


def _connector_worker():
    real = offloading.OffloadingConnectorWorker
    cls = type(
        "Instrumented",
        (real,),
        {
            "prepare_store_kv": wrap(real.prepare_store_kv, kv_transfer.OffloadingPrepareStore(), SYNC)[0],
            "start_kv_transfers": wrap(real.start_kv_transfers, kv_transfer.OffloadingStartTransfers(), SYNC)[0],
            "get_finished": wrap(real.get_finished, kv_transfer.OffloadingGetFinished(), SYNC)[0],
        },
    )
    worker = cls.__new__(cls)
    worker.worker = StandInWorker()
    worker._is_store_writer = True
    worker._load_jobs = {}
    worker._unsubmitted_store_jobs = []
    worker._connector_worker_meta = common.OffloadingWorkerMetadata()
    return worker


def _job(req_id):
    return common.TransferJob(req_id, base.GPULoadStoreSpec([1, 2], [2], [0]), base.GPULoadStoreSpec([3, 4], [2], [0]))


def _metadata(load=(), store=()):
    return common.OffloadingConnectorMetadata(
        load_jobs={j: _job(f"r{j}") for j in load}, store_jobs={j: _job(f"r{j}") for j in store}
    )


def test_offloading_jobs_match_vllms_own_transfer_stats_with_the_phase_of_their_step(metrics):
    kv_transfer.JOB_PHASES.clear()
    w = _connector_worker()
    Result = base.TransferResult
    # Step 1 (prefill) produces two stores: queued, submitted at the next step.
    STATE.last_step_phase = "prefill"
    w.start_kv_transfers(_metadata())
    w.prepare_store_kv(_metadata(store=(1, 2)))
    # Step 2 (decode) submits them and loads job 3.
    STATE.last_step_phase = "decode"
    w.start_kv_transfers(_metadata(load=(3,)))
    assert w.worker.submitted == [("store", 1), ("store", 2), ("load", 3)]
    w.worker.done = [Result(1, True, 4096, 0.5), Result(3, True, 2048, 0.25)]
    assert w.get_finished(set()) == (set(), {"r3"})
    w.worker.done = [Result(2, True, 1024, 0.125)]
    w.get_finished(set())
    stats = w.build_connector_worker_meta().transfer_stats  # vLLM's own numbers

    def labels(phase, direction):
        return {"dp": "0", "role": "mixed", "phase": phase, "direction": direction, "connector": "OffloadingConnector"}

    assert metrics.value(P + "kv_transfer:bytes", **labels("prefill", "d2h")) == stats.store.bytes == 5120
    assert metrics.value(P + "kv_transfer:count", **labels("prefill", "d2h")) == len(stats.store.sizes) == 2
    assert metrics.value(P + "kv_transfer:bytes", **labels("decode", "h2d")) == stats.load.bytes == 2048
    assert metrics.value(P + "kv_transfer:count", **labels("decode", "h2d")) == len(stats.load.sizes) == 1
    count, seconds, _ = metrics.value(P + "kv_transfer:duration", **labels("prefill", "d2h"))
    assert (count, seconds) == (2, stats.store.time)  # one observation per poll
    count, seconds, _ = metrics.value(P + "kv_transfer:duration", **labels("decode", "h2d"))
    assert (count, seconds) == (1, stats.load.time)
    assert metrics.value(P + "kv_transfer:bytes", **labels("decode", "d2h")) is None  # a store keeps its step
    assert not kv_transfer.JOB_PHASES  # every job's phase was taken


def test_jobs_of_several_phases_in_one_poll_split_its_time_by_bytes(metrics):
    kv_transfer.JOB_PHASES.clear()
    w = _connector_worker()
    STATE.last_step_phase = "prefill"
    w.prepare_store_kv(_metadata(store=(1,)))
    STATE.last_step_phase = "decode"
    w.start_kv_transfers(_metadata())
    w.prepare_store_kv(_metadata(store=(2,)))
    w.start_kv_transfers(_metadata())
    w.worker.done = [base.TransferResult(1, True, 3072, 0.25), base.TransferResult(2, True, 1024, 0.25)]
    w.get_finished(set())
    stats = w.build_connector_worker_meta().transfer_stats

    def value(phase):
        return metrics.value(
            P + "kv_transfer:duration",
            dp="0",
            role="mixed",
            phase=phase,
            direction="d2h",
            connector="OffloadingConnector",
        )

    assert value("prefill")[1] == 0.375 and value("decode")[1] == 0.125
    assert value("prefill")[1] + value("decode")[1] == stats.store.time
