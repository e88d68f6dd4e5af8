"""KV transfers (connectors moving KV cache in and out of the paged KV cache) and KV-cache writes.

Transfers are recorded in the worker that runs them, labelled ``direction`` (h2d: into the KV cache,
d2h: out of it, remote: another node), ``connector`` (the connector's class name) and the ``phase``
of the worker step that submitted them (``STATE.last_step_phase``, set by the model runner hook when the
step began). ExampleConnector copies synchronously inside the step, so its submit step is the step.

KV-cache writes are recorded in the EngineCore with each scheduled step (``scheduler.py``'s deferred
records call ``kv_writes``): tokens scheduled per req_phase times the KV bytes per token that
``Scheduler.__init__`` found in its ``KVCacheConfig`` (``bytes_per_token``)."""

from __future__ import annotations

from time import perf_counter

from .. import context, recording
from ..catalogue import M
from ..environment import traces_enabled
from ..hooks.handler import Handler, report
from ..hooks.patches import stand_in
from ..state import STATE, UNKNOWN

_BYTES = M["kv_transfer:bytes"]
_COUNT = M["kv_transfer:count"]
_DURATION = M["kv_transfer:duration"]
_BLOCKING = M["kv_transfer:blocking:duration"]
_WRITES = M["kv_cache:write_bytes"]


def labels_of(phase: str, direction: str, connector: str, _labels=STATE.kv_labels) -> tuple:
    """``(dp, role, phase, direction, connector)`` (cached in ``STATE.kv_labels``, emptied with the other
    label caches when the process identity changes)."""
    key = (phase, direction, connector)
    labels = _labels.get(key)
    if labels is None:
        labels = _labels[key] = (context.PROCESS.dp, context.PROCESS.role, phase, direction, connector)
    return labels


def record_transfer(
    direction: str,
    connector: str,
    nbytes: int,
    count: int,
    seconds: float | None = None,
    blocking: float | None = None,
    phase: str | None = None,
) -> None:
    """One connector call's transfers: ``count`` transfers of ``nbytes`` bytes in all, taking ``seconds``
    (None: not measured), of which ``blocking`` seconds blocked the step's host thread."""
    labels = labels_of(phase or STATE.last_step_phase, direction, connector)
    step = STATE.worker_step
    if step is not None and step.marks is not None:  # step records on: the worker step's KV, for its record
        kv = step.kv
        if kv is None:
            kv = step.kv = []
        kv.append((direction, connector, nbytes, count, perf_counter(), blocking))
    recording.add(_BYTES, nbytes, labels)
    recording.add(_COUNT, count, labels)
    if seconds is not None:
        recording.record(_DURATION, seconds, labels)
    if blocking is not None:
        recording.record(_BLOCKING, blocking, labels)


def _token_bytes(kv_layer) -> int:
    """Bytes one token occupies in a layer's standardized ``[blocks, heads, block_size, head_size]``
    view (``[blocks, 1, block_size, latent]`` for MLA): what ExampleConnector copies per slot."""
    return kv_layer[0, :, 0].numel() * kv_layer.element_size()


def _connector_name(connector) -> str:
    return type(connector).__name__


class ExampleSaveKvLayer(Handler):
    """``ExampleConnector.save_kv_layer(layer_name, kv_layer, attn_metadata)``: one safetensors file
    per storing request of the step's metadata for this layer (d2h): its slots times the layer's
    bytes per token; the call's wall time (a synchronous copy and file write)."""

    params = ("layer_name", "kv_layer")

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, start, args, kwargs, result):
        seconds = perf_counter() - start
        connector, kv_layer = args[0], args[2]
        tokens = files = 0
        for request in connector._get_connector_metadata().requests:
            if request.is_store:
                tokens += len(request.slot_mapping)
                files += 1
        if files:
            record_transfer("d2h", _connector_name(connector), tokens * _token_bytes(kv_layer), files, seconds, seconds)


class ExampleStartLoadKv(Handler):
    """``ExampleConnector.start_load_kv(forward_context)``: per loading request (h2d) and attention
    layer of the forward context (one file each), its slots times that layer's bytes per token; the
    call's wall time (it reads and copies every file before it returns)."""

    params = ("forward_context",)

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, start, args, kwargs, result):
        seconds = perf_counter() - start
        connector, forward_context = args[0], args[1]
        if getattr(forward_context, "attn_metadata", None) is None:
            return  # vLLM returns before loading anything
        loads = [len(r.slot_mapping) for r in connector._get_connector_metadata().requests if not r.is_store]
        if not loads:
            return
        nbytes = files = 0
        for layer in forward_context.no_compile_layers.values():
            kv_layer = getattr(layer, "kv_cache", None)
            if kv_layer is None:
                continue
            per_token = _token_bytes(kv_layer)
            for tokens in loads:
                nbytes += tokens * per_token
                files += 1
        record_transfer("h2d", _connector_name(connector), nbytes, files, seconds, seconds)


# -- KV-cache writes ------------------------------------------------------------------------------------


def bytes_per_token(kv_cache_config) -> int:
    """KV bytes one token writes: over the attention groups of a ``KVCacheConfig``, the page size per
    token of the group's spec times its layers (state-space groups hold per-request state: skipped)."""
    try:
        from vllm.v1.kv_cache_interface import AttentionSpec
    except ImportError:  # pragma: no cover - vLLM without it
        AttentionSpec = None
    total = 0
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if AttentionSpec is not None and not isinstance(spec, AttentionSpec):
            continue
        total += spec.page_size_bytes // spec.block_size * len(group.layer_names)
    return total


class SchedulerInit(Handler):
    """``Scheduler.__init__(vllm_config, kv_cache_config, …)``: the KV bytes per scheduled token; with request
    traces on, the KV-load notes of a scheduler with a KV connector (``traces.watch_kv_loads``)."""

    params = ("vllm_config", "kv_cache_config")

    def after(self, state, args, kwargs, result):
        if traces_enabled():
            from .traces import watch_kv_loads

            try:
                watch_kv_loads(args[0])
            except Exception:
                report(self, "watch_kv_loads")
        config = getattr(args[0], "kv_cache_config", None) or args[2]
        STATE.kv_bytes_per_token = bytes_per_token(config)


def kv_writes(tokens: int, labels: tuple, _state=STATE) -> None:
    """``tokens`` scheduled tokens of one req_phase (``labels``: dp, role, phase, req_phase), with the KV
    bytes per token ``Scheduler.__init__`` found (``STATE.kv_bytes_per_token``; 0: unknown, nothing)."""
    per_token = _state.kv_bytes_per_token
    if per_token and tokens:
        recording.add(_WRITES, tokens * per_token, labels)


# -- OffloadingConnector ----------------------------------------------------------------------------------

#: ``STATE.kv_job_phases``: job id → phase of the worker step that submitted it to the OffloadingWorker (vLLM
#: 0.32+: ``start_kv_transfers`` or ``handle_preemptions``; 0.23: ``OffloadingWorker.transfer_async``); taken
#: when the job completes. A store is queued by ``prepare_store_kv`` in the step that produced its KV and
#: submitted by the next step: it carries that next step's phase. Bounded: jobs that never complete here
#: (another worker's, a shutdown) are dropped with the oldest.
JOB_PHASES = STATE.kv_job_phases
_MAX_JOBS = 65536
_OFFLOADING = "OffloadingConnector"
_H2D, _D2H = 0, 1
_DIRECTIONS = ("h2d", "d2h")


def _keep(jobs, phase: str) -> None:
    if len(JOB_PHASES) > _MAX_JOBS:
        JOB_PHASES.clear()
    for job_id in jobs:
        JOB_PHASES[job_id] = phase


def _keep_queued_stores(handler, connector_worker, phase: str) -> None:
    """The phase of the stores the previous step queued (``_unsubmitted_store_jobs``: job id first), submitted by
    this call. A read that fails loses only those jobs' phase (their bytes read ``phase="unknown"``)."""
    try:
        _keep([job[0] for job in connector_worker._unsubmitted_store_jobs], phase)
    except Exception:
        report(handler, "_unsubmitted_store_jobs")


class _MeteredOffloadingWorker:
    """Stands in for the ``OffloadingWorker`` of a vLLM 0.32+ ``OffloadingConnectorWorker`` (its ``worker``
    attribute, replaced at the first ``start_kv_transfers`` / ``handle_preemptions``): the host time of each
    ``submit_store`` (d2h), ``submit_load`` (h2d) and ``wait(job_ids)`` (h2d when one of the jobs is a load of
    the connector worker's ``_load_jobs``, else d2h) is added to ``spent`` (seconds and calls per direction),
    which the connector-worker hooks read around their call. vLLM's CPU/GPU worker builds and launches the
    copies on the calling thread in ``submit_*`` and synchronizes on their CUDA events in ``wait``: the step
    waits for both. Everything else reaches the real worker; each call runs exactly once."""

    __slots__ = ("_worker", "_owner", "spent")

    def __init__(self, worker, owner) -> None:
        self._worker = worker
        self._owner = owner
        self.spent = [0.0, 0.0, 0, 0]  # seconds h2d, d2h; calls h2d, d2h

    def __getattr__(self, name):
        return getattr(self._worker, name)

    def submit_store(self, *args, **kwargs):
        start = perf_counter()
        ok = self._worker.submit_store(*args, **kwargs)
        self._add(_D2H, perf_counter() - start)
        return ok

    def submit_load(self, *args, **kwargs):
        start = perf_counter()
        ok = self._worker.submit_load(*args, **kwargs)
        self._add(_H2D, perf_counter() - start)
        return ok

    def wait(self, job_ids):
        start = perf_counter()
        result = self._worker.wait(job_ids)
        seconds = perf_counter() - start
        try:
            loads = self._owner._load_jobs
            self._add(_H2D if any(job in loads for job in job_ids) else _D2H, seconds)
        except Exception:
            report(_METERED_WORKER, "wait")
        return result

    def _add(self, direction: int, seconds: float) -> None:
        spent = self.spent
        spent[direction] += seconds
        spent[direction + 2] += 1


_METERED_WORKER = Handler()
_METERED_WORKER.name = "kv_transfer:MeteredOffloadingWorker"


def _metered(connector_worker) -> _MeteredOffloadingWorker | None:
    """The connector worker's metered OffloadingWorker (installed now if needed), its counts zeroed."""
    worker = connector_worker.worker
    if worker is None:
        return None
    if type(worker) is not _MeteredOffloadingWorker:
        worker = stand_in(connector_worker, "worker", _MeteredOffloadingWorker(worker, connector_worker))
    spent = worker.spent
    spent[0] = spent[1] = 0.0
    spent[2] = spent[3] = 0
    return worker


def _record_blocking(worker: _MeteredOffloadingWorker | None) -> None:
    """One ``kv_transfer:blocking:duration`` observation per direction the call submitted or waited for."""
    if worker is None:
        return
    spent = worker.spent
    phase = STATE.last_step_phase
    for direction in (_H2D, _D2H):
        if spent[direction + 2]:
            recording.record(_BLOCKING, spent[direction], labels_of(phase, _DIRECTIONS[direction], _OFFLOADING))


class OffloadingStartTransfers(Handler):
    """``OffloadingConnectorWorker.start_kv_transfers(metadata)`` (vLLM 0.32+): it submits the stores the
    previous step queued (``_unsubmitted_store_jobs``, d2h) and this step's loads (h2d; 0.33 then waits for
    the loads its request needs in this step): each job keeps this step's phase, and the host time of the
    submissions and the wait, per direction, is time the step is blocked (``_MeteredOffloadingWorker``)."""

    params = ("metadata",)

    def before(self, args, kwargs):
        connector_worker = args[0]
        phase = STATE.last_step_phase
        _keep_queued_stores(self, connector_worker, phase)
        try:
            _keep(args[1].load_jobs, phase)
        except Exception:
            report(self, "metadata.load_jobs")
        return _metered(connector_worker)  # last: only the blocking durations depend on it

    def after(self, worker, args, kwargs, result):
        _record_blocking(worker)


class OffloadingHandlePreemptions(Handler):
    """``OffloadingConnectorWorker.handle_preemptions(metadata)`` (vLLM 0.32+, at the start of the step): it
    submits the queued stores and this step's stores that must be flushed (``jobs_to_flush`` among
    ``store_jobs``, when this worker writes), then waits for ``jobs_to_flush``: the submitted jobs keep this
    step's phase, and the host time of the submissions and the wait is time the step is blocked."""

    params = ("kv_connector_metadata",)

    def before(self, args, kwargs):
        connector_worker, metadata = args[0], args[1]
        phase = STATE.last_step_phase
        _keep_queued_stores(self, connector_worker, phase)
        try:
            flush = metadata.jobs_to_flush
            if flush and getattr(connector_worker, "_is_store_writer", True):
                _keep([job for job in flush if job in metadata.store_jobs], phase)
        except Exception:
            report(self, "metadata.jobs_to_flush")
        return _metered(connector_worker)  # last: only the blocking durations depend on it

    def after(self, worker, args, kwargs, result):
        _record_blocking(worker)


class OffloadingGetFinished(Handler):
    """``OffloadingConnectorWorker.get_finished`` (vLLM 0.32+): the jobs it completed and the sizes
    and device times vLLM itself recorded for them (``transfer_stats.load`` / ``.store`` of the
    worker's ``OffloadingWorkerMetadata``, the numbers behind ``vllm:kv_offload_*``): one transfer per
    job, its bytes labelled with the phase of the step that submitted it. The poll's time per direction is
    one duration observation (split by bytes when jobs of several phases completed in one poll).

    vLLM 0.34+ reports failed jobs: marked completed and in the metadata's ``failed_jobs``, with no stats.
    Each is one ``kv_transfer:failures`` (h2d for a load, d2h for a store, the submitting step's phase),
    and is left out of the pairing of the direction's sizes with its jobs' phases. A failed sync load makes
    vLLM raise: the poll is recorded all the same (``error``)."""

    reads_args = 1  # self

    def before(self, args, kwargs):
        worker = args[0]
        meta = worker._connector_worker_meta
        stats = meta.transfer_stats
        loads = set(worker._load_jobs) if worker._load_jobs else ()
        load, store = stats.load, stats.store
        return meta, len(meta.completed_jobs), loads, len(load.sizes), load.time, len(store.sizes), store.time

    def after(self, state, args, kwargs, result):
        meta, seen, loads, load_n, load_t, store_n, store_t = state
        if len(meta.completed_jobs) == seen:
            return
        jobs = list(meta.completed_jobs)[seen:]
        failed = getattr(meta, "failed_jobs", None)  # vLLM 0.34+
        if failed:
            lost = [j for j in jobs if j in failed]
            if lost:
                jobs = [j for j in jobs if j not in failed]
                for j in lost:
                    record_failure("h2d" if j in loads else "d2h", _OFFLOADING, phase=JOB_PHASES.pop(j, UNKNOWN))
        stats = meta.transfer_stats
        for direction, direction_stats, n, t, these in (
            ("h2d", stats.load, load_n, load_t, [j for j in jobs if j in loads]),
            ("d2h", stats.store, store_n, store_t, [j for j in jobs if j not in loads]),
        ):
            phases = [JOB_PHASES.pop(j, UNKNOWN) for j in these]
            sizes = direction_stats.sizes[n:]
            if not sizes:
                continue
            if len(sizes) != len(phases):  # some jobs reported no size: their phases cannot be paired
                phases = [UNKNOWN] * len(sizes)
            _record_poll(direction, sizes, phases, direction_stats.time - t)

    def error(self, state, args, kwargs, exc):
        self.after(state, args, kwargs, None)  # vLLM 0.34 raises on a failed sync load, after marking it


def _record_poll(direction: str, sizes: list, phases: list, seconds: float) -> None:
    by_phase: dict = {}
    for size, phase in zip(sizes, phases):
        entry = by_phase.get(phase)
        if entry is None:
            by_phase[phase] = [size, 1]
        else:
            entry[0] += size
            entry[1] += 1
    total = sum(sizes) or 1
    for phase, (nbytes, count) in by_phase.items():
        share = seconds if len(by_phase) == 1 else seconds * nbytes / total
        record_transfer(direction, _OFFLOADING, int(nbytes), count, share, phase=phase)


class OffloadingTransferAsync(Handler):
    """vLLM 0.23 ``OffloadingWorker.transfer_async(job_id, spec)``: the job keeps the phase of the step
    that submits it (``start_kv_transfers`` or ``handle_preemptions``; as on 0.32+, a store is queued in
    the step that produced its KV and submitted by the next one, whose phase it carries)."""

    params = ("job_id",)

    def after(self, state, args, kwargs, result):
        _keep((args[1],), STATE.last_step_phase)


#: Media the KV cache lives in (vLLM's GPU, vllm-ascend's NPU): a transfer into one of them is a load.
_DEVICE_MEDIA = ("GPU", "NPU")


class OffloadingWorkerGetFinished(Handler):
    """vLLM 0.23 ``OffloadingWorker.get_finished()``: each TransferResult with a size: h2d when its
    ``transfer_type`` ends in a device medium (GPU, NPU), d2h when it starts in one."""

    reads_args = 0

    def after(self, state, args, kwargs, result):
        for r in result or ():
            phase = JOB_PHASES.pop(r.job_id, UNKNOWN)
            size = r.transfer_size
            kind = r.transfer_type
            if size is None or kind is None:
                continue
            direction = "h2d" if kind[1] in _DEVICE_MEDIA else "d2h" if kind[0] in _DEVICE_MEDIA else "remote"
            record_transfer(direction, _OFFLOADING, size, 1, r.transfer_time, phase=phase)


# -- remote connectors' own transfer stats (vLLM's NIXL and Mooncake connectors) ---------------------------

_FAILURES = M["kv_transfer:failures"]
_NIXL = "NixlConnector"
_MOONCAKE = "MooncakeConnector"


def record_failure(direction: str, connector: str, count: int = 1, phase: str | None = None) -> None:
    """``count`` transfers the connector reported as failed."""
    recording.add(_FAILURES, count, labels_of(phase or STATE.last_step_phase, direction, connector))


class NixlRecordTransfer(Handler):
    """``NixlKVConnectorStats.record_transfer(res)``: one completed NIXL transfer (the worker's
    ``_pop_done_transfers`` found its handle DONE, polled in the worker step, so the phase is the polling
    step's): NIXL's telemetry ``totalBytes`` and ``xferDuration`` (µs, as NIXL measured the transfer),
    the values behind ``vllm:nixl_bytes_transferred`` and ``vllm:nixl_xfer_time_seconds``. vLLM 0.32+
    passes None when NIXL gave no telemetry: nothing is recorded, as vLLM records nothing."""

    params = ("res",)

    def after(self, state, args, kwargs, result):
        res = args[1]
        if res is not None:
            record_transfer("remote", _NIXL, res.totalBytes, 1, res.xferDuration / 1e6)


class MooncakeRecordTransfer(Handler):
    """``MooncakeKVConnectorStats.record_transfer(duration_s, total_bytes, num_descs)``: one successful
    ``batch_transfer_sync_write`` of the prefill side's sender pool (``MooncakeConnectorWorker._send_blocks``):
    its bytes and the wall time vLLM measured around the synchronous call. It runs on a sender thread, in no
    worker step: phase ``unknown``."""

    params = ("duration_s", "total_bytes")

    def after(self, state, args, kwargs, result):
        record_transfer("remote", _MOONCAKE, args[2], 1, args[1], phase=UNKNOWN)


class NixlFailedTransfer(Handler):
    """``NixlKVConnectorStats.record_failed_transfer()``: a NIXL transfer that failed (a handle not DONE
    nor in progress, or a read that could not be posted), in the worker step that found it."""

    reads_args = 0

    def after(self, state, args, kwargs, result):
        record_failure("remote", _NIXL)


class MooncakeFailedTransfer(Handler):
    """``MooncakeKVConnectorStats.record_failed_transfer()`` (a failed send) and ``record_failed_recv()``
    (a request whose remote KV load failed): on the connector's threads, phase ``unknown``."""

    reads_args = 0

    def after(self, state, args, kwargs, result):
        record_failure("remote", _MOONCAKE, phase=UNKNOWN)


# -- vllm-ascend: Mooncake P2P (kv_p2p) and AscendStore (kv_pool) -----------------------------------------


class _MeteredEngine:
    """Stands in for a Mooncake ``TransferEngine`` in the one thread object that holds it as ``engine``
    (vllm-ascend's ``KVCacheRecvingThread`` / ``KVCacheSendingLayerThread``, which use it only for
    ``batch_transfer_sync_read`` / ``_write``: the contract test checks it): each synchronous batch's bytes
    (``sum(length_list)``), one transfer, its wall time; a negative return is a failure. Everything else
    reaches the real engine. The original call runs exactly once, whatever recording does."""

    __slots__ = ("_engine", "_connector")

    def __init__(self, engine, connector: str) -> None:
        self._engine = engine
        self._connector = connector

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def batch_transfer_sync_read(self, session_id, src_list, dst_list, length_list):
        start = perf_counter()
        ret = self._engine.batch_transfer_sync_read(session_id, src_list, dst_list, length_list)
        self._record(ret, length_list, perf_counter() - start)
        return ret

    def batch_transfer_sync_write(self, session_id, src_list, dst_list, length_list):
        start = perf_counter()
        ret = self._engine.batch_transfer_sync_write(session_id, src_list, dst_list, length_list)
        self._record(ret, length_list, perf_counter() - start)
        return ret

    def _record(self, ret, length_list, seconds: float) -> None:
        try:
            if isinstance(ret, int) and ret < 0:
                record_failure("remote", self._connector, phase=UNKNOWN)
            else:
                record_transfer("remote", self._connector, sum(length_list), 1, seconds, phase=UNKNOWN)
        except Exception:
            report(_METERED, "Mooncake TransferEngine batch transfer")


_METERED = Handler()
_METERED.name = "kv_transfer:MooncakeTransferEngine"  # what a recording failure's log line names


class AscendMooncakeThreadInit(Handler):
    """``__init__`` of vllm-ascend's Mooncake transfer threads (``KVCacheRecvingThread`` of the P2P and
    hybrid connectors, which pull remote KV with ``batch_transfer_sync_read`` in
    ``_transfer_kv_cache_all_groups``; ``KVCacheSendingLayerThread`` of the layerwise connector, which pushes
    with ``batch_transfer_sync_write``): the thread's ``engine`` becomes a ``_MeteredEngine``. The transfers
    run on that thread, in no worker step: phase ``unknown``; direction ``remote``."""

    reads_args = 1  # self
    connector = "MooncakeConnector"

    def after(self, state, args, kwargs, result):
        thread = args[0]
        engine = getattr(thread, "engine", None)
        if engine is not None and not isinstance(engine, _MeteredEngine):
            stand_in(thread, "engine", _MeteredEngine(engine, self.connector))


class AscendMooncakeLayerwiseThreadInit(AscendMooncakeThreadInit):
    connector = "MooncakeLayerwiseConnector"


_ASCEND_STORE = "AscendStoreConnector"


def _nbytes(sizes) -> int:
    return sum(sum(per_key) for per_key in sizes)


class AscendStorePut(Handler):
    """An AscendStore backend's ``put(keys, addrs, sizes)`` (Mooncake store, Memcache, Yuanrong): the
    keys' bytes (``sizes``: per key, the sizes of its buffers) leave the KV cache (d2h, into the pool),
    one transfer per key; the call's wall time. The backends log a failed put and return nothing, so a
    put is counted as done. Called from the connector's sending threads: phase ``unknown``."""

    params = ("keys", "addrs", "sizes")

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, start, args, kwargs, result):
        keys, sizes = args[1], args[3]
        if keys:
            record_transfer("d2h", _ASCEND_STORE, _nbytes(sizes), len(keys), perf_counter() - start, phase=UNKNOWN)


class AscendStoreGet(Handler):
    """An AscendStore backend's ``get(keys, addrs, sizes)``: the keys it loaded into the KV cache (h2d),
    one transfer per key, by its result (per key, 0 = loaded, as vllm-ascend's ``record_failed_blocks``
    reads it); the keys with another code are failures, and a None result (the backend caught an error,
    or its store is not initialised; it logged "Failed to get") fails every key. The call's wall time.
    Called from the connector's receiving threads: phase ``unknown``."""

    params = ("keys", "addrs", "sizes")

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, start, args, kwargs, result):
        seconds = perf_counter() - start
        keys, sizes = args[1], args[3]
        if not keys:
            return
        if result is None:
            record_failure("h2d", _ASCEND_STORE, len(keys), phase=UNKNOWN)
            return
        codes = list(result)
        loaded = [size for size, code in zip(sizes, codes) if code == 0]
        failed = len(keys) - len(loaded)
        if loaded:
            record_transfer("h2d", _ASCEND_STORE, _nbytes(loaded), len(loaded), seconds, phase=UNKNOWN)
        if failed:
            record_failure("h2d", _ASCEND_STORE, failed, phase=UNKNOWN)


class MemcacheStorePut(AscendStorePut):
    """``MemcacheBackend.put(key, addr, size)``: AscendStorePut under the backend's own parameter names."""

    params = ("key", "addr", "size")


class MemcacheStoreGet(AscendStoreGet):
    """``MemcacheBackend.get(key, addr, size)``: AscendStoreGet under the backend's own parameter names."""

    params = ("key", "addr", "size")
