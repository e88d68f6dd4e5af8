"""The one recording layer: every handler records through these functions, and nothing else
touches OTel instruments. The hot path can be made faster here, in one place.

Values are exact: ``add(spec, 0, …)`` adds nothing (no "≤0 counts as 1" rule). Labels are tuples of
values in the catalogue's label order (``context.step_labels(phase)`` gives the step-scoped ones), so
the hot path builds no dicts. Which recorder sits behind these functions is the pipeline's choice:
the pre-aggregating fast path (default) or the OTel SDK.

This facade only re-exports (the functions live in ``instruments``, ``deferred`` and ``control``; no module
of ``recording/`` imports it) and wires the pipeline's steps that belong to this layer: at the start of every
collection the deferred records, then the handler failures (``hook_errors``) and the export time for
``control status``; in a forked child the flush listener and the control's poller of its own. The handlers'
own pre-collection work is registered by ``instrument()`` (``pipeline.add_pre_collect``).
"""

from __future__ import annotations

from . import control, failures, pipeline, shutdown, step_records, traces
from .control import control_changed
from .deferred import defer, flush, in_step_inline, record_in_step, record_later, run_deferred
from .instruments import (
    add,
    generation,
    observe,
    process_started,
    record,
    record_exemplar,
    record_many,
    record_n,
    set_gauge,
)
from .shutdown import after_stop, before_stop

__all__ = [
    "add",
    "after_stop",
    "before_stop",
    "control_changed",
    "defer",
    "flush",
    "generation",
    "in_step_inline",
    "observe",
    "process_started",
    "record",
    "record_exemplar",
    "record_in_step",
    "record_later",
    "record_many",
    "record_n",
    "run_deferred",
    "set_gauge",
]

pipeline.add_pre_collect(run_deferred, pipeline.RECORDS)
pipeline.add_pre_collect(failures.export, pipeline.REPORTS)  # those of the records just made included
pipeline.add_pre_collect(traces.export_drops, pipeline.REPORTS)  # traces_dropped
pipeline.add_pre_collect(step_records.export_drops, pipeline.REPORTS)  # step_record_dropped
pipeline.add_pre_collect(control.exported, pipeline.REPORTS)  # the last export's time, for `control status`
pipeline.add_after_fork(shutdown.after_fork_in_child)  # the child answers flush requests on its own socket
pipeline.add_after_fork(control.after_fork_in_child)  # …and polls the control file on its own thread
