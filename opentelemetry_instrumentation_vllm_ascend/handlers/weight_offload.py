"""Weight offloading (vLLM's ``--cpu-offload-gb`` / ``--offload-backend``): the bytes of model weights an
offloader keeps in host memory instead of the device, read where vLLM decides them.

- ``UVAOffloader`` (vLLM's default backend): ``wrap_modules`` moves parameters to (pinned) CPU memory until
  ``cpu_offload_max_bytes``, adding each one's bytes to ``cpu_offload_bytes``; read after every call (it
  accumulates over the model's ``make_layers`` calls). Parameters already on CPU are skipped: on vLLM's CPU
  build nothing is offloaded and the value is 0.
- ``PrefetchOffloader`` (``--offload-backend prefetch``) and vllm-ascend's ``NPUPrefetchOffloader``:
  ``post_init`` sums its module offloaders' bytes into ``total_offloaded_bytes``; read after it.

No h2d bytes: with UVA the device reads host memory through its views (no copy call); without UVA
(``VLLM_WEIGHT_OFFLOADING_DISABLE_UVA=1``) the copies run in a closure ``_maybe_offload_to_cpu`` installs as the
module's ``forward`` (``v.to(device)`` per state_dict entry, then ``torch.func.functional_call``), with no
hookable point; the prefetch backends' copies (``start_onload_to_static``) are captured into CUDA / NPU graphs,
whose replays no Python hook sees."""

from __future__ import annotations

from .. import context, recording
from ..catalogue import ALL, M
from ..hooks.handler import Handler, report

_RESIDENT = M["memory:weight_offload_bytes"]


def _record(offloader, nbytes) -> None:
    if nbytes is not None:
        recording.set_gauge(_RESIDENT, nbytes, context.step_labels_with(ALL, type(offloader).__name__))


class UVAWrapModules(Handler):
    """``UVAOffloader.wrap_modules(modules_generator, prefix)``: ``cpu_offload_bytes`` after the call."""

    reads_args = 1  # self

    def after(self, state, args, kwargs, result):
        try:  # set in UVAOffloader.__init__ by every supported vLLM: its absence is drift, reported, not a 0
            nbytes = args[0].cpu_offload_bytes
        except AttributeError:
            report(self, "cpu_offload_bytes")
            return
        _record(args[0], nbytes)


class PrefetchPostInit(Handler):
    """``PrefetchOffloader.post_init()`` / ``NPUPrefetchOffloader.post_init()``: ``total_offloaded_bytes``."""

    reads_args = 1  # self

    def after(self, state, args, kwargs, result):
        try:  # set in PrefetchOffloader.__init__: its absence is drift, reported
            nbytes = args[0].total_offloaded_bytes
        except AttributeError:
            report(self, "total_offloaded_bytes")
            return
        _record(args[0], nbytes)
