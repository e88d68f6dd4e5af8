"""The pre-aggregating recorder: the default hot path of the recording layer.

Recording is a dict update in a per-thread shard (no lock, nothing lost when threads record at once);
collection merges the shards into standard OTel ``MetricsData`` — the catalogue's names, units,
descriptions, labels and buckets, as the SDK's Views would produce them — and hands it to ordinary
SDK ``MetricReader``s (the /metrics files reader, OTLP readers, an InMemoryMetricReader in tests)
through the same collect hook a MeterProvider uses. Exporters cannot tell the two paths apart; a
property test checks that the Prometheus exposition and the OTLP payloads are identical
(``OTEL_VLLM_ASCEND_RECORDER=sdk`` selects the SDK path instead).

Semantics follow the SDK: explicit-bucket histograms put ``v`` in the first bucket whose bound is
``>= v`` and keep min/max; cumulative series live for the process's life; delta exports carry only
series that got measurements since that reader's previous collection (min/max then cover that
interval). Counts are exact: no sampling. Histogram sums are float sums of the same values; they
can differ from the SDK's in the last bits because the SDK adds per collection interval and then to
the running total (and a delta sum here is a difference of cumulative sums). A collection taken
while another thread records may lag that thread's observation in flight by one export interval.

Exemplars (``record_exemplar``: an observation that names its trace) are kept as the SDK's
``AlignedHistogramBucketExemplarReservoir`` keeps them: the latest one per bucket and series, each handed
to every reader once, in its first collection after the observation (then that reader's reservoir is
empty again, cumulative or delta). ``record`` / ``record_many`` / ``record_n`` never touch them.
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from time import time_ns
from types import MappingProxyType

from opentelemetry.sdk.metrics import Counter, Exemplar
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import catalogue, environment, targets
from ..context import series_attributes as _attributes
from . import private_otel

# MetricReader keys its temporality table by the SDK's internal instrument classes (recording/private_otel.py;
# without them the pipeline records with the SDK recorder, and this table's keys are the public classes).
_COUNTER_KEY, _HISTOGRAM_KEY, _GAUGE_KEY = private_otel.INSTRUMENT_KEYS or (Counter, HistogramInstrument, None)

_INF = float("inf")
#: Orders exemplars across instruments: a reader's collection takes those numbered after its previous one.
_EXEMPLAR_SEQUENCE = itertools.count(1)
DELTA = AggregationTemporality.DELTA
CUMULATIVE = AggregationTemporality.CUMULATIVE


class _Instrument:
    """Per-thread shards of ``{label values tuple: state}``."""

    __slots__ = ("spec", "process_labels", "_tls", "_shards", "_lock", "start_ns")

    def __init__(self, spec: catalogue.MetricSpec) -> None:
        self.spec = spec
        #: ``targets.process_labels(spec)``, read once (derived from the target table).
        self.process_labels = targets.process_labels(spec)
        self._tls = threading.local()
        self._shards: list[dict] = []
        self._lock = threading.Lock()
        self.start_ns = time_ns()

    def _new_shard(self) -> dict:
        shard: dict = {}
        with self._lock:
            self._shards.append(shard)
        self._tls.shard = shard
        return shard

    def shards(self) -> list[dict]:
        with self._lock:
            shards = list(self._shards)
        # dict.copy() runs in C without releasing the GIL: a consistent snapshot of each shard.
        return [shard.copy() for shard in shards]


class FastCounter(_Instrument):
    __slots__ = ()

    def add(self, value, labels: tuple) -> None:
        try:
            shard = self._tls.shard
        except AttributeError:
            shard = self._new_shard()
        shard[labels] = shard.get(labels, 0) + value

    def snapshot(self) -> dict:
        total: dict = {}
        for shard in self.shards():
            for key, value in shard.items():
                total[key] = total.get(key, 0) + value
        return total


class FastHistogram(_Instrument):
    """State per series: [sum, min, max, bucket_counts, window_min, window_max] (the count is the sum of
    the bucket counts). The window min/max (for delta readers) are only kept when the store has a
    delta reader. ``record`` / ``record_many`` are closures over this instrument's thread-local and
    bounds (no attribute lookups on the hot path)."""

    __slots__ = ("bounds", "record", "record_many", "record_n", "exemplars_on", "_exemplars", "_exemplar_lock")

    def __init__(self, spec: catalogue.MetricSpec, windows: bool = False, exemplars: bool = True) -> None:
        super().__init__(spec)
        self.bounds = tuple(float(b) for b in spec.buckets or ())
        self.record, self.record_many, self.record_n = self._recorders(windows)
        #: False with OTEL_METRICS_EXEMPLAR_FILTER=always_off: ``record_exemplar`` only records.
        self.exemplars_on = exemplars
        #: {label values: {bucket index: (sequence, value, time ns, trace id, span id)}}, the latest per bucket.
        self._exemplars: dict[tuple, dict[int, tuple]] = {}
        self._exemplar_lock = threading.Lock()

    def record_exemplar(self, value, labels: tuple, trace_id: int, span_id: int) -> None:
        """``record(value, labels)``, and the observation becomes its bucket's exemplar (the bucket's previous
        one, if no reader collected it yet, is replaced, as the SDK's aligned-bucket reservoir does)."""
        self.record(value, labels)
        if not self.exemplars_on:
            return
        offered = (next(_EXEMPLAR_SEQUENCE), value, time_ns(), trace_id, span_id)
        index = bisect_left(self.bounds, value)
        with self._exemplar_lock:
            per = self._exemplars.get(labels)
            if per is None:
                per = self._exemplars[labels] = {}
            per[index] = offered

    def exemplars(self, after: int, upto: int) -> dict:
        """{label values: [(value, time ns, trace id, span id), …]} of the exemplars numbered in (after, upto),
        in bucket order (a reader's collection: those offered since its previous one)."""
        if not self._exemplars:
            return {}
        out: dict = {}
        with self._exemplar_lock:
            items = [(labels, sorted(per.items())) for labels, per in self._exemplars.items()]
        for labels, per in items:
            chosen = [offered[1:] for _index, offered in per if after < offered[0] < upto]
            if chosen:
                out[labels] = chosen
        return out

    def _state(self, labels):
        try:
            shard = self._tls.shard
        except AttributeError:
            shard = self._new_shard()
        state = shard[labels] = [0, _INF, -_INF, [0] * (len(self.bounds) + 1), _INF, -_INF]
        return state

    def _recorders(self, windows: bool):
        tls, bounds, new_state = self._tls, self.bounds, self._state

        def record(value, labels: tuple, _bisect=bisect_left) -> None:
            try:
                state = tls.shard[labels]
            except (AttributeError, KeyError):
                state = new_state(labels)
            state[0] += value
            if value < state[1]:
                state[1] = value
            if value > state[2]:
                state[2] = value
            state[3][_bisect(bounds, value)] += 1

        def record_many(values, labels: tuple, _bisect=bisect_left, _bisect_right=bisect_right) -> tuple:
            """``record(value, labels)`` for each of ``values`` (the same state; the sum adds them in
            order). Returns (state, min, max) for the window variant."""
            try:
                state = tls.shard[labels]
            except (AttributeError, KeyError):
                state = new_state(labels)
            ordered = sorted(values)  # in C: min, max and the bucket counts by bisecting it
            low, high = ordered[0], ordered[-1]
            buckets = state[3]
            first, last = _bisect(bounds, low), _bisect(bounds, high)
            if first != last:
                done = 0  # values counted so far: those <= bounds[i - 1]
                for i in range(first, last):
                    upto = _bisect_right(ordered, bounds[i], done)
                    buckets[i] += upto - done
                    done = upto
                buckets[last] += len(ordered) - done
            else:
                buckets[first] += len(ordered)  # all in one bucket (many short scopes of one step)
            state[0] = sum(values, state[0])
            if low < state[1]:
                state[1] = low
            if high > state[2]:
                state[2] = high
            return state, low, high

        def record_n(value, n: int, labels: tuple, _bisect=bisect_left) -> list:
            """``record(value, labels)`` ``n`` (> 0) times; the sum adds ``value * n`` (exact for the
            integer values it is used for). Returns the state for the window variant."""
            try:
                state = tls.shard[labels]
            except (AttributeError, KeyError):
                state = new_state(labels)
            state[0] += value * n
            if value < state[1]:
                state[1] = value
            if value > state[2]:
                state[2] = value
            state[3][_bisect(bounds, value)] += n
            return state

        if not windows:
            return record, record_many, record_n

        def record_with_window(value, labels: tuple) -> None:
            record(value, labels)
            state = tls.shard[labels]
            if value < state[4]:
                state[4] = value
            if value > state[5]:
                state[5] = value

        def record_many_with_window(values, labels: tuple) -> None:
            state, low, high = record_many(values, labels)
            if low < state[4]:
                state[4] = low
            if high > state[5]:
                state[5] = high

        def record_n_with_window(value, n: int, labels: tuple) -> None:
            state = record_n(value, n, labels)
            if value < state[4]:
                state[4] = value
            if value > state[5]:
                state[5] = value

        return record_with_window, record_many_with_window, record_n_with_window

    def snapshot(self, reset_window: bool = False) -> dict:
        total: dict = {}
        with self._lock:
            shards = list(self._shards)
        for shard in shards:
            for key, state in list(shard.items()):
                # Buckets first, count from them: a snapshot taken while the owner thread records
                # stays self-consistent (count == sum of buckets); the sum may lag one observation.
                buckets = list(state[3])
                count, sum_, mn, mx, wmin, wmax = sum(buckets), state[0], state[1], state[2], state[4], state[5]
                if reset_window:
                    state[4], state[5] = _INF, -_INF
                merged = total.get(key)
                if merged is None:
                    total[key] = [count, sum_, mn, mx, buckets, wmin, wmax]
                else:
                    merged[0] += count
                    merged[1] += sum_
                    merged[2] = min(merged[2], mn)
                    merged[3] = max(merged[3], mx)
                    merged[4] = [a + b for a, b in zip(merged[4], buckets)]
                    merged[5] = min(merged[5], wmin)
                    merged[6] = max(merged[6], wmax)
        return total


class FastGauge(_Instrument):
    __slots__ = ()

    def set(self, value, labels: tuple) -> None:
        try:
            shard = self._tls.shard
        except AttributeError:
            shard = self._new_shard()
        shard[labels] = (value, time_ns())

    def snapshot(self, since: int = -1) -> dict:
        """Last value per series, of the series set after ``since`` (ns)."""
        latest: dict = {}
        for shard in self.shards():
            for key, (value, t) in shard.items():
                if key not in latest or latest[key][1] <= t:
                    latest[key] = (value, t)
        return {key: value for key, (value, t) in latest.items() if t > since}


_KINDS = MappingProxyType(
    {catalogue.COUNTER: FastCounter, catalogue.HISTOGRAM: FastHistogram, catalogue.GAUGE: FastGauge}
)


class Store:
    """All fast instruments of one process, and their collection for any number of readers."""

    def __init__(self, resource, scope_name: str, scope_version: str, process_attributes=None) -> None:
        self.resource = resource
        #: ``process_attributes(targets.process_labels(spec))`` → {label: value} the recording process adds to
        #: every series of such a spec (the worker's ``rank``), at collection: nothing on the hot path.
        self._process_attributes: Callable[[tuple], dict] = process_attributes or (lambda names: {})
        self.scope = InstrumentationScope(scope_name, scope_version, None, None)
        self._instruments: dict[str, FastCounter | FastHistogram | FastGauge] = {}
        self._lock = threading.Lock()
        self._previous: dict[int, tuple[int, dict]] = {}  # per delta reader: (time, {seed: snapshot})
        self._windows = False  # keep per-interval min/max: only when a reader takes delta histograms
        #: OTEL_METRICS_EXEMPLAR_FILTER, read once as the SDK's MeterProvider reads it.
        self._exemplars = environment.exemplars_enabled()
        #: Per reader: the exemplar sequence number its previous collection stopped at.
        self._exemplars_taken: dict[int, int] = {}
        #: Called at the start of every collection (observable gauges set their values there).
        self.before_collect: list = []

    def instrument(self, spec: catalogue.MetricSpec):
        instrument = self._instruments.get(spec.seed)
        if instrument is None:
            with self._lock:
                instrument = self._instruments.get(spec.seed)
                if instrument is None:
                    if spec.kind == catalogue.HISTOGRAM:
                        instrument = FastHistogram(spec, windows=self._windows, exemplars=self._exemplars)
                    else:
                        instrument = _KINDS[spec.kind](spec)
                    self._instruments[spec.seed] = instrument
        return instrument

    # -- collection -------------------------------------------------------------------------
    def attach(self, reader) -> None:
        """Make ``reader.collect()`` read this store (as a MeterProvider would)."""
        temporalities = private_otel.temporalities(reader)
        if temporalities.get(_HISTOGRAM_KEY, temporalities.get(HistogramInstrument)) == DELTA:
            self._windows = True
        private_otel.set_collect_callback(reader, self.collect_for)

    def collect_for(self, reader, timeout_millis: float = 10_000) -> MetricsData | None:
        for hook in list(self.before_collect):
            hook()
        temporalities = private_otel.temporalities(reader)
        counter_t = temporalities.get(_COUNTER_KEY, temporalities.get(Counter, CUMULATIVE))
        histogram_t = temporalities.get(_HISTOGRAM_KEY, temporalities.get(HistogramInstrument, CUMULATIVE))
        gauge_t = temporalities.get(_GAUGE_KEY, CUMULATIVE)
        now = time_ns()
        exemplars_after = self._exemplars_taken.get(id(reader), 0)
        exemplars_upto = self._exemplars_taken[id(reader)] = next(_EXEMPLAR_SEQUENCE)
        delta = DELTA in (counter_t, histogram_t, gauge_t)
        previous_time, previous = self._previous.get(id(reader), (None, {}))
        current: dict = {}
        metrics = []
        with self._lock:
            instruments = list(self._instruments.values())
        for instrument in instruments:
            spec = instrument.spec
            labels = spec.labels
            process_labels = instrument.process_labels
            extra = self._process_attributes(process_labels) if process_labels else None
            if isinstance(instrument, FastCounter):
                snap = instrument.snapshot()
                current[spec.seed] = snap
                points = self._sum_points(
                    snap, previous.get(spec.seed, {}), labels, counter_t, instrument.start_ns, previous_time, now, extra
                )
                if points:
                    metrics.append(Metric(spec.exposed_name, spec.description, spec.unit, Sum(points, counter_t, True)))
            elif isinstance(instrument, FastHistogram):
                snap = instrument.snapshot(reset_window=histogram_t == DELTA)
                current[spec.seed] = snap
                points = self._histogram_points(
                    snap,
                    previous.get(spec.seed, {}),
                    labels,
                    histogram_t,
                    instrument.bounds,
                    instrument.start_ns,
                    previous_time,
                    now,
                    extra,
                    instrument.exemplars(exemplars_after, exemplars_upto),
                )
                if points:
                    metrics.append(
                        Metric(spec.exposed_name, spec.description, spec.unit, Histogram(points, histogram_t))
                    )
            else:
                # Like the SDK's last-value aggregation: every collection reports the last value,
                # except a delta collection, which reports only gauges set since its previous one.
                since = previous_time if gauge_t == DELTA and previous_time is not None else -1
                snap = instrument.snapshot(since)
                points = [
                    NumberDataPoint(_attributes(labels, key, extra), None, now, value) for key, value in snap.items()
                ]
                if points:
                    metrics.append(Metric(spec.exposed_name, spec.description, spec.unit, Gauge(points)))
        if delta:
            self._previous[id(reader)] = (now, current)
        if not metrics:
            return None
        return MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(self.scope, metrics, "")], "")])

    @staticmethod
    def _sum_points(snap, before, labels, temporality, start_ns, previous_time, now, extra=None):
        points = []
        for key, value in snap.items():
            if temporality == DELTA:
                change = value - before.get(key, 0)
                if key in before and change == 0:
                    continue
                points.append(NumberDataPoint(_attributes(labels, key, extra), previous_time or start_ns, now, change))
            else:
                points.append(NumberDataPoint(_attributes(labels, key, extra), start_ns, now, value))
        return points

    @staticmethod
    def _histogram_points(
        snap, before, labels, temporality, bounds, start_ns, previous_time, now, extra=None, exemplars=None
    ):
        points = []
        for key, (count, sum_, mn, mx, buckets, wmin, wmax) in snap.items():
            offered = exemplars.get(key) if exemplars else None
            if temporality == DELTA:
                old = before.get(key)
                if old is not None:
                    if count == old[0]:
                        continue
                    count, sum_ = count - old[0], sum_ - old[1]
                    buckets = [a - b for a, b in zip(buckets, old[4])]
                mn, mx = wmin, wmax
                start = previous_time or start_ns
            else:
                start = start_ns
            attributes = _attributes(labels, key, extra)
            # As the SDK's reservoir reports them: the measurement's attributes less the point's (none here).
            filtered = {} if attributes else None
            points.append(
                HistogramDataPoint(
                    attributes,
                    start,
                    now,
                    count,
                    sum_,
                    buckets,
                    bounds,
                    mn,
                    mx,
                    [Exemplar(filtered, value, t, span_id, trace_id) for value, t, trace_id, span_id in offered]
                    if offered
                    else [],
                )
            )
        return points
