"""OffloadingConnector transfers through vLLM's own OffloadingConnectorWorker (0.32+): its real
handle_preemptions / start_kv_transfers / prepare_store_kv / get_finished, with our hooks on the rows'
methods, around a stand-in OffloadingWorker that completes jobs with sizes and times and advances an
injected clock in each submit and wait. Oracles: the transfer stats vLLM itself builds from the same
results (``build_connector_worker_meta().transfer_stats``, what ``vllm:kv_offload_{load,store}_bytes`` /
``_time`` / ``_size`` are made from), the stand-in's own clock steps, and the step each job was submitted
in (``StandInWorker.submitted``). The vLLM 0.23 rows (``OffloadingWorker.transfer_async`` /
``get_finished``) run on fakes shaped like 0.23.0's OffloadingWorker, checked against its source."""

import types
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.handlers import kv_transfer
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.contract import VLLM_VERSIONS, at_least, fake_problems
from tests.support.fakes import patch_clock

P = catalogue.PREFIX
STORE_S, LOAD_S, WAIT_S = 0.125, 0.25, 0.5  # the stand-in's host time per submit_store / submit_load / wait


def labels(phase, direction):
    return {"dp": "0", "role": "mixed", "phase": phase, "direction": direction, "connector": "OffloadingConnector"}


class StandInWorker:
    """An OffloadingWorker's interface (vLLM 0.32 ``v1/kv_offload/base.py``): accepts every job, noting the
    phase of the step that submitted it; ``done`` lists what get_finished returns next. Each submit and wait
    takes host time on ``clock``."""

    def __init__(self, clock=None):
        self.clock = clock
        self.submitted = []
        self.waited = []
        self.done = []

    def _spend(self, seconds):
        if self.clock is not None:
            self.clock.t += seconds

    def submit_store(self, job_id, src_spec, dst_spec):
        self.submitted.append(("store", job_id, STATE.last_step_phase))
        self._spend(STORE_S)
        return True

    def submit_load(self, job_id, src_spec, dst_spec, **kwargs):  # 0.33 adds expedited=
        self.submitted.append(("load", job_id, STATE.last_step_phase))
        self._spend(LOAD_S)
        return True

    def get_finished(self):
        done, self.done = self.done, []
        return done

    def wait(self, job_ids):
        self.waited.append(set(job_ids))
        self._spend(WAIT_S)


@pytest.fixture
def offloading():
    return (
        pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker"),
        pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.offloading.common"),
        pytest.importorskip("vllm.v1.kv_offload.base"),
    )


def _connector_worker(offloading, clock=None, writer=True):
    module, common, _ = offloading
    real = module.OffloadingConnectorWorker
    cls = type(
        "Instrumented",
        (real,),
        {
            "handle_preemptions": wrap(real.handle_preemptions, kv_transfer.OffloadingHandlePreemptions(), SYNC)[0],
            "start_kv_transfers": wrap(real.start_kv_transfers, kv_transfer.OffloadingStartTransfers(), SYNC)[0],
            "get_finished": wrap(real.get_finished, kv_transfer.OffloadingGetFinished(), SYNC)[0],
        },
    )
    worker = cls.__new__(cls)
    worker.worker = worker.stand_in = StandInWorker(clock)
    worker._is_store_writer = writer
    worker._load_jobs = {}
    worker._unsubmitted_store_jobs = []
    worker._connector_worker_meta = common.OffloadingWorkerMetadata()
    return worker


def _metadata(offloading, load=(), store=(), flush=None):
    _, common, base = offloading

    def job(j):
        return common.TransferJob(
            f"r{j}", base.GPULoadStoreSpec([1, 2], [2], [0]), base.GPULoadStoreSpec([3], [1], [0])
        )

    return common.OffloadingConnectorMetadata(
        load_jobs={j: job(j) for j in load}, store_jobs={j: job(j) for j in store}, jobs_to_flush=flush
    )


def test_the_stand_in_worker_has_the_shape_of_vllms_offloading_worker():
    from tests.contract.test_vllm import tree_for

    for version in [v for v in VLLM_VERSIONS if at_least(v, "0.32") and not at_least(v, "0.34")]:
        test_only = {"clock", "submitted", "waited", "done", "_spend"}
        fakes = [(StandInWorker, StandInWorker(), "vllm.v1.kv_offload.base", "OffloadingWorker", test_only)]
        assert fake_problems(tree_for(version), fakes) == [], version


def test_offloading_jobs_match_vllms_own_transfer_stats_with_the_phase_of_the_step_that_submitted_them(
    metrics, offloading
):
    kv_transfer.JOB_PHASES.clear()
    w = _connector_worker(offloading)
    Result = offloading[2].TransferResult
    # Step 1 (prefill) produces two stores: queued by prepare_store_kv, submitted by the next step.
    STATE.last_step_phase = "prefill"
    w.start_kv_transfers(_metadata(offloading))
    w.prepare_store_kv(_metadata(offloading, store=(1, 2)))
    # Step 2 (decode) submits them and loads job 3.
    STATE.last_step_phase = "decode"
    w.start_kv_transfers(_metadata(offloading, load=(3,)))
    assert w.stand_in.submitted == [("store", 1, "decode"), ("store", 2, "decode"), ("load", 3, "decode")]
    w.stand_in.done = [Result(1, True, 4096, 0.5), Result(3, True, 2048, 0.25)]
    assert w.get_finished(set()) == (set(), {"r3"})
    w.stand_in.done = [Result(2, True, 1024, 0.125)]
    w.get_finished(set())
    stats = w.build_connector_worker_meta().transfer_stats  # vLLM's own numbers

    assert metrics.value(P + "kv_transfer:bytes", **labels("decode", "d2h")) == stats.store.bytes == 5120
    assert metrics.value(P + "kv_transfer:count", **labels("decode", "d2h")) == len(stats.store.sizes) == 2
    assert metrics.value(P + "kv_transfer:bytes", **labels("decode", "h2d")) == stats.load.bytes == 2048
    assert metrics.value(P + "kv_transfer:count", **labels("decode", "h2d")) == len(stats.load.sizes) == 1
    count, seconds, _ = metrics.value(P + "kv_transfer:duration", **labels("decode", "d2h"))
    assert (count, seconds) == (2, stats.store.time)  # one observation per poll
    count, seconds, _ = metrics.value(P + "kv_transfer:duration", **labels("decode", "h2d"))
    assert (count, seconds) == (1, stats.load.time)
    # The step that produced the stores' KV submitted nothing: no series of its phase.
    assert metrics.value(P + "kv_transfer:bytes", **labels("prefill", "d2h")) is None
    assert not kv_transfer.JOB_PHASES  # every job's phase was taken


def test_jobs_of_several_phases_in_one_poll_split_its_time_by_bytes(metrics, offloading):
    kv_transfer.JOB_PHASES.clear()
    w = _connector_worker(offloading)
    Result = offloading[2].TransferResult
    STATE.last_step_phase = "decode"
    w.prepare_store_kv(_metadata(offloading, store=(1,)))
    STATE.last_step_phase = "prefill"
    w.start_kv_transfers(_metadata(offloading))  # submits store 1 in a prefill step
    w.prepare_store_kv(_metadata(offloading, store=(2,)))
    STATE.last_step_phase = "decode"
    w.start_kv_transfers(_metadata(offloading))  # submits store 2 in a decode step
    w.stand_in.done = [Result(1, True, 3072, 0.25), Result(2, True, 1024, 0.25)]
    w.get_finished(set())
    stats = w.build_connector_worker_meta().transfer_stats

    def seconds(phase):
        return metrics.value(P + "kv_transfer:duration", **labels(phase, "d2h"))[1]

    assert seconds("prefill") == 0.375 and seconds("decode") == 0.125
    assert seconds("prefill") + seconds("decode") == stats.store.time


def test_the_host_time_of_submissions_and_waits_blocks_the_step_per_direction(metrics, offloading, monkeypatch):
    """Each connector-worker call's submit_store (d2h), submit_load (h2d) and wait (the jobs' direction)
    time, one blocking observation per call and direction: a step that only stores records d2h; a step
    that stores and loads records both; handle_preemptions records its submissions and its flush wait."""
    kv_transfer.JOB_PHASES.clear()
    clock = patch_clock(monkeypatch, kv_transfer)
    w = _connector_worker(offloading, clock)
    STATE.last_step_phase = "prefill"
    w.prepare_store_kv(_metadata(offloading, store=(1,)))
    STATE.last_step_phase = "decode"
    w.start_kv_transfers(_metadata(offloading))  # only the store of the step before
    assert metrics.value(P + "kv_transfer:blocking:duration", **labels("decode", "d2h"))[:2] == (1, STORE_S)
    assert metrics.value(P + "kv_transfer:blocking:duration", **labels("decode", "h2d")) is None
    w.prepare_store_kv(_metadata(offloading, store=(2, 3)))
    STATE.last_step_phase = "prefill"
    w.start_kv_transfers(_metadata(offloading, load=(4,)))  # two stores, then a load
    assert metrics.value(P + "kv_transfer:blocking:duration", **labels("prefill", "d2h"))[:2] == (1, 2 * STORE_S)
    assert metrics.value(P + "kv_transfer:blocking:duration", **labels("prefill", "h2d"))[:2] == (1, LOAD_S)
    # Preemptions: job 6 of this step must be flushed; job 5 was queued by the step before.
    w.prepare_store_kv(_metadata(offloading, store=(5,)))
    STATE.last_step_phase = "mixed"
    metadata = _metadata(offloading, store=(6, 7), flush={6})
    w.handle_preemptions(metadata)
    assert w.stand_in.waited == [{6}] and set(metadata.store_jobs) == {7}
    assert metrics.value(P + "kv_transfer:blocking:duration", **labels("mixed", "d2h"))[:2] == (1, 2 * STORE_S + WAIT_S)
    assert [s for s in w.stand_in.submitted if s[2] == "mixed"] == [("store", 5, "mixed"), ("store", 6, "mixed")]
    assert {j: p for j, p in kv_transfer.JOB_PHASES.items() if j in (5, 6)} == {5: "mixed", 6: "mixed"}
    # A wait for a load (vLLM 0.33's sync loads, a cache reset) blocks h2d.
    w._load_jobs[8] = None
    metered = w.worker
    metered.spent[:] = [0.0, 0.0, 0, 0]
    metered.wait({8})
    assert metered.spent == [WAIT_S, 0.0, 1, 0]


def test_a_worker_that_does_not_write_keeps_no_phase_for_the_stores_it_skips(metrics, offloading):
    kv_transfer.JOB_PHASES.clear()
    w = _connector_worker(offloading, writer=False)
    STATE.last_step_phase = "decode"
    w.handle_preemptions(_metadata(offloading, store=(1,), flush={1}))
    w.prepare_store_kv(_metadata(offloading, store=(2,)))
    w.start_kv_transfers(_metadata(offloading))
    assert w.stand_in.submitted == [] and not kv_transfer.JOB_PHASES


# -- vLLM 0.23: OffloadingWorker.transfer_async / get_finished ------------------------------------------------


class GPUSpec:
    """A LoadStoreSpec (vLLM 0.23 ``v1/kv_offload/base.py``): its static medium() names where the blocks live."""

    @staticmethod
    def medium():
        return "GPU"


def spec(medium):
    return type(f"{medium}Spec", (GPUSpec,), {"medium": staticmethod(lambda: medium)})()


class TransferResult:
    """vLLM 0.23's ``TransferResult`` dataclass (``v1/kv_offload/worker/worker.py``)."""

    def __init__(self, job_id, success, transfer_size=None, transfer_time=None, transfer_type=None):
        self.job_id = job_id
        self.success = success
        self.transfer_size = transfer_size
        self.transfer_time = transfer_time
        self.transfer_type = transfer_type


class OffloadingWorker023:
    """vLLM 0.23's concrete ``OffloadingWorker``: ``transfer_async(job_id, spec)`` with spec ``(src, dst)``,
    ``get_finished()`` returning the TransferResults that completed."""

    def __init__(self):
        self.finished = []

    def transfer_async(self, job_id, spec):
        return True

    def get_finished(self):
        done, self.finished = self.finished, []
        return done


def test_the_0_23_fakes_have_the_shape_of_vllm_0_23_classes():
    from tests.contract.test_vllm import tree_for

    tree = tree_for("0.23.0")
    module = "vllm.v1.kv_offload.worker.worker"
    fakes = [
        (OffloadingWorker023, OffloadingWorker023(), module, "OffloadingWorker", {"finished"}),
        (TransferResult, TransferResult(1, True), module, "TransferResult", set()),
        (GPUSpec, None, "vllm.v1.kv_offload.base", "LoadStoreSpec", set()),
    ]
    assert fake_problems(tree, fakes) == []
    assert fake_problems(tree, fakes[:1], check_init=True) == []


def test_vllm_0_23_results_by_transfer_type_with_the_submitting_steps_phase(metrics):
    """transfer_type (src medium, dst medium) gives the direction: into a device medium (GPU, NPU) is h2d, out
    of one d2h, neither end a device remote; a result without a size or a type records nothing but still
    takes its job's phase; each job is labelled with the phase of the step whose transfer_async submitted it
    (a store produced by a prefill step is submitted by the next, decode, step)."""
    kv_transfer.JOB_PHASES.clear()
    cls = type(
        "Instrumented",
        (OffloadingWorker023,),
        {
            "transfer_async": wrap(OffloadingWorker023.transfer_async, kv_transfer.OffloadingTransferAsync(), SYNC)[0],
            "get_finished": wrap(OffloadingWorker023.get_finished, kv_transfer.OffloadingWorkerGetFinished(), SYNC)[0],
        },
    )
    w = cls()
    gpu, cpu, npu = spec("GPU"), spec("CPU"), spec("NPU")
    STATE.last_step_phase = "prefill"
    assert w.transfer_async(1, (cpu, gpu)) is True  # a load for the prefill
    STATE.last_step_phase = "decode"
    w.transfer_async(2, (gpu, cpu))  # the prefill's store, submitted by the next step
    w.transfer_async(3, (npu, cpu))  # vllm-ascend's NPU medium
    w.transfer_async(4, (cpu, spec("DISK")))
    w.transfer_async(5, (gpu, cpu))
    assert kv_transfer.JOB_PHASES == {1: "prefill", 2: "decode", 3: "decode", 4: "decode", 5: "decode"}
    w.finished = [
        TransferResult(1, True, 2048, 0.25, ("CPU", "GPU")),
        TransferResult(2, True, 4096, 0.5, ("GPU", "CPU")),
        TransferResult(3, True, 1024, 0.125, ("NPU", "CPU")),
        TransferResult(4, True, 512, 0.0625, ("CPU", "DISK")),
        TransferResult(5, True, None, None, None),  # vLLM records no stats for it either
    ]
    assert len(w.get_finished()) == 5
    assert not kv_transfer.JOB_PHASES
    got = {
        (dict(k)["phase"], dict(k)["direction"]): v
        for k, v in metrics.points()[P + "kv_transfer:bytes"].items()
        if dict(k)["connector"] == "OffloadingConnector"
    }
    assert got == {("prefill", "h2d"): 2048, ("decode", "d2h"): 4096 + 1024, ("decode", "remote"): 512}
    count, seconds, _ = metrics.value(P + "kv_transfer:duration", **labels("decode", "d2h"))
    assert (count, seconds) == (2, 0.5 + 0.125)  # one observation per job
    assert metrics.value(P + "kv_transfer:count", **labels("decode", "d2h")) == 2
    assert P + "kv_transfer:blocking:duration" not in metrics.points()  # not measured on 0.23


def test_vllm_0_23_results_survive_none_and_unknown_jobs(metrics):
    handler = kv_transfer.OffloadingWorkerGetFinished()
    handler.after(None, (), {}, None)  # no result
    handler.after(None, (), {}, [NS(job_id=99, transfer_size=8, transfer_time=None, transfer_type=("GPU", "CPU"))])
    assert metrics.value(P + "kv_transfer:bytes", **labels("unknown", "d2h")) == 8  # a job never submitted here
    assert metrics.value(P + "kv_transfer:count", **labels("unknown", "d2h")) == 1
    assert P + "kv_transfer:duration" not in metrics.points()  # no transfer_time: no duration


def test_uninstrument_gives_the_connector_worker_its_own_offloading_worker_back(metrics, offloading):
    """The metered stand-in replaces the connector worker's ``worker`` at the first step; the instrumentation's
    removal puts vLLM's object back (it would otherwise go on timing every submission)."""
    from opentelemetry_instrumentation_vllm_ascend.hooks.patches import restore_stand_ins

    restore_stand_ins()  # earlier tests' stand-ins
    w = _connector_worker(offloading)
    STATE.last_step_phase = "decode"
    w.start_kv_transfers(_metadata(offloading))
    assert type(w.worker) is kv_transfer._MeteredOffloadingWorker and w.worker._worker is w.stand_in
    w.start_kv_transfers(_metadata(offloading))  # one stand-in, however many steps
    assert w.worker._worker is w.stand_in
    assert restore_stand_ins() == 1
    assert w.worker is w.stand_in
    assert restore_stand_ins() == 0


# -- vLLM 0.34: submit_* take device pointers; failed jobs ------------------------------------------------------

_V034 = [v for v in VLLM_VERSIONS if at_least(v, "0.34")]


class StandInWorker034(StandInWorker):
    """vLLM 0.34's OffloadingWorker interface: the device side of a job is its resolved ``device_ptrs``
    (``submit_store(job_id, device_ptrs, dst_spec)``, ``submit_load(job_id, src_spec, device_ptrs, expedited)``)."""

    def submit_store(self, job_id, device_ptrs, dst_spec):
        return super().submit_store(job_id, device_ptrs, dst_spec)

    def submit_load(self, job_id, src_spec, device_ptrs, expedited=False):
        return super().submit_load(job_id, src_spec, device_ptrs)


@pytest.mark.parametrize("version", _V034)
def test_the_0_34_stand_in_worker_has_the_shape_of_vllms_offloading_worker(version):
    from tests.contract.test_vllm import tree_for

    test_only = {"clock", "submitted", "waited", "done", "_spend"}
    fakes = [(StandInWorker034, StandInWorker034(), "vllm.v1.kv_offload.base", "OffloadingWorker", test_only)]
    assert fake_problems(tree_for(version), fakes) == []


def test_the_metered_worker_passes_0_34_s_device_pointers_through(metrics, offloading, monkeypatch):
    """The metered stand-in forwards submit_* arguments as given: 0.34's device_ptrs (and expedited=) reach the
    real worker, and the host time is still split by direction."""
    clock = patch_clock(monkeypatch, kv_transfer)
    real = StandInWorker034(clock)
    metered = kv_transfer._MeteredOffloadingWorker(real, NS(_load_jobs={}))
    STATE.last_step_phase = "decode"
    assert metered.submit_store(1, "device-ptrs", "dst") is True
    assert metered.submit_load(2, "src", "device-ptrs", expedited=True) is True
    assert real.submitted == [("store", 1, "decode"), ("load", 2, "decode")]
    assert metered.spent == [LOAD_S, STORE_S, 1, 1]


def _connector_worker_034(offloading, version, tree):
    """An OffloadingConnectorWorker whose ``get_finished`` and metadata are vLLM ``version``'s own (compiled from
    its source against the installed vLLM: 0.34 marks failed jobs instead of asserting success)."""
    from tests.support.vllm_source import functions, load_module

    module, _, _ = offloading
    common = load_module(tree, _OFFLOADING_COMMON)
    namespace = dict(vars(module), ReqId=str, OffloadingWorkerMetadata=common.OffloadingWorkerMetadata)
    get_finished = functions(tree, _OFFLOADING_WORKER, ["OffloadingConnectorWorker.get_finished"], namespace)
    w = _connector_worker(offloading)
    hooked = wrap(get_finished["OffloadingConnectorWorker.get_finished"], kv_transfer.OffloadingGetFinished(), SYNC)[0]
    w.get_finished = types.MethodType(hooked, w)
    w._failed_recving = set()
    w._connector_worker_meta = common.OffloadingWorkerMetadata()
    return w, common


_OFFLOADING_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker"
_OFFLOADING_COMMON = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common"


@pytest.mark.parametrize("version", _V034)
def test_failed_offload_jobs_are_failures_and_leave_the_other_jobs_phases_paired(metrics, offloading, version):
    """vLLM 0.34's own get_finished: a store (job 2) and a load (job 3) fail among successful jobs. Each failure is
    one kv_transfer:failures with its direction and the phase of the step that submitted it; the successful jobs'
    bytes keep their phases (before: the direction's sizes and jobs did not pair, and every byte read
    phase=unknown); vLLM's own stats are the oracle for the bytes. A failed sync load (job 4): vLLM raises, the
    failure is counted all the same."""
    from tests.contract.test_vllm import tree_for

    kv_transfer.JOB_PHASES.clear()
    w, common = _connector_worker_034(offloading, version, tree_for(version))
    Result = offloading[2].TransferResult
    STATE.last_step_phase = "prefill"
    w.start_kv_transfers(_metadata(offloading, load=(3,)))  # load 3 in a prefill step
    w.prepare_store_kv(_metadata(offloading, store=(1, 2)))  # its stores, queued for the next step
    STATE.last_step_phase = "decode"
    w.start_kv_transfers(_metadata(offloading))  # submits stores 1, 2 in a decode step
    w.stand_in.done = [Result(1, True, 4096, 0.5), Result(2, False), Result(3, False)]
    assert w.get_finished(set()) == (set(), {"r3"})
    assert w._failed_recving == {"r3"}
    stats = w._connector_worker_meta.transfer_stats  # vLLM's own numbers
    assert w._connector_worker_meta.failed_jobs == {2, 3}
    assert metrics.value(P + "kv_transfer:bytes", **labels("decode", "d2h")) == stats.store.bytes == 4096
    assert metrics.value(P + "kv_transfer:count", **labels("decode", "d2h")) == 1
    assert metrics.value(P + "kv_transfer:duration", **labels("decode", "d2h"))[:2] == (1, stats.store.time)
    assert metrics.value(P + "kv_transfer:failures", **labels("decode", "d2h")) == 1
    assert metrics.value(P + "kv_transfer:failures", **labels("prefill", "h2d")) == 1
    assert not any(dict(k)["phase"] == "unknown" for k in metrics.points()[P + "kv_transfer:bytes"])
    assert not kv_transfer.JOB_PHASES

    w._load_jobs[4] = None  # a sync load, submitted in a decode step
    kv_transfer.JOB_PHASES[4] = "decode"
    w.stand_in.done = [Result(4, False)]
    with pytest.raises(RuntimeError, match="sync load job 4 failed"):
        w.get_finished(set())
    assert metrics.value(P + "kv_transfer:failures", **labels("decode", "h2d")) == 1


def test_a_failing_read_of_the_queued_stores_loses_only_their_phase(metrics, offloading, monkeypatch, caplog):
    """Narrow degradation: the queued stores' entries change shape (iterable as vLLM unpacks them, no longer
    indexable: the handler's ``job[0]`` read fails). Only those jobs' phase is lost (their bytes read
    phase=unknown, still counted exactly); the load's phase and every blocking duration are exact; one warning."""
    import logging

    class Job:
        def __init__(self, *fields):
            self.fields = fields

        def __iter__(self):
            return iter(self.fields)

    kv_transfer.JOB_PHASES.clear()
    clock = patch_clock(monkeypatch, kv_transfer)
    w = _connector_worker(offloading, clock)
    Result = offloading[2].TransferResult
    STATE.last_step_phase = "prefill"
    w.prepare_store_kv(_metadata(offloading, store=(1,)))
    w._unsubmitted_store_jobs = [Job(*job) for job in w._unsubmitted_store_jobs]
    with caplog.at_level(logging.WARNING):
        w.start_kv_transfers(_metadata(offloading, load=(2,)))
        w.prepare_store_kv(_metadata(offloading, store=(3,)))
        w._unsubmitted_store_jobs = [Job(*job) for job in w._unsubmitted_store_jobs]
        w.start_kv_transfers(_metadata(offloading))
    assert w.stand_in.submitted == [("store", 1, "prefill"), ("load", 2, "prefill"), ("store", 3, "prefill")]
    assert metrics.value(P + "kv_transfer:blocking:duration", **labels("prefill", "d2h"))[:2] == (2, 2 * STORE_S)
    assert metrics.value(P + "kv_transfer:blocking:duration", **labels("prefill", "h2d"))[:2] == (1, LOAD_S)
    w.stand_in.done = [Result(1, True, 4096, 0.5), Result(2, True, 2048, 0.25), Result(3, True, 1024, 0.125)]
    w.get_finished(set())
    assert metrics.value(P + "kv_transfer:bytes", **labels("prefill", "h2d")) == 2048
    assert metrics.value(P + "kv_transfer:bytes", **labels("unknown", "d2h")) == 4096 + 1024
    assert metrics.value(P + "kv_transfer:bytes", **labels("prefill", "d2h")) is None
    warnings = [r.getMessage() for r in caplog.records if "OffloadingStartTransfers" in r.getMessage()]
    assert len(warnings) == 1 and "_unsubmitted_store_jobs" in warnings[0]
