"""Installs the target table's rows and the rows users' hook files compile to: now for modules already
imported, otherwise the moment a module finishes importing (a post-import hook; nothing imports vLLM early).
Version-gated rows are skipped; a missing symbol is one clear log line (a rejected entry, for a hook file),
never an exception."""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from .. import catalogue, neighbours, supported
from .. import targets as targets_module
from ..environment import traces_enabled
from ..hooks.handler import Handler
from ..hooks.patches import hook_future_class, original_class, patch_method
from ..kinds import FUTURE_CLASS, SCOPE_FACTORY, SYNC
from ..recording import control
from ..state import STATE
from . import userfile
from .declarative import load_handler, spec_of
from .ready_points import READY_POINTS, module_exists
from .target_status import (  # noqa: F401  (check's statuses: cli/* and the tests read them through installer)
    DISABLED,
    GATED,
    MISSING,
    NOT_INSTALLED,
    PENDING,
    RESOLVED,
    TRACES_OFF,
    exposed_name,
    gate_of,
    metric_status,
    resolve,
    target_row,
)
from .versions import in_range, installed_version, vllm_ascend_version, vllm_distribution, vllm_version  # noqa: F401

logger = logging.getLogger(__name__)


def check(table=None) -> list[dict]:
    """Status of every target for the installed vLLM / vllm-ascend (the ``check`` command)."""
    vllm, ascend = vllm_version(), vllm_ascend_version()
    rows = []
    for target in table if table is not None else targets_module.TARGETS:
        gate = gate_of(target, vllm, ascend, checking=True)
        status, detail = (gate, "") if gate is not None else resolve(target)
        rows.append(target_row(target, status, detail))
    return rows


def configuration(overrides: dict | None = None):
    """The execution paths (``paths.detect``) a server started from this environment takes."""
    from .. import paths

    return paths.detect(vllm_version(), vllm_ascend_version() is not None, vllm_distribution(), overrides=overrides)


def uncovered_overrides(table=None) -> list[dict]:
    """The overrides (``targets.UNCOVERED_OVERRIDES``) that exist in the installed versions: classes
    that bypass a hook without a row of their own, and the metrics absent wherever they run."""
    vllm, ascend = vllm_version(), vllm_ascend_version()
    out = []
    for override in table if table is not None else targets_module.UNCOVERED_OVERRIDES:
        if override.vllm_ascend is not None and (ascend is None or not in_range(ascend, override.vllm_ascend)):
            continue
        if not in_range(vllm, override.vllm):
            continue
        out.append(
            {
                "symbol": override.symbol,
                "bypasses": override.hooked,
                "reason": override.reason,
                "absent": [exposed_name(seed) for seed in targets_module.bypassed_feeds(override)],
            }
        )
    return out


# -- the report of targets that never resolved, once a process is ready to serve (``ready_points``) -------------
class _Ready(Handler):
    """After a ready point returns: the installer's report (``Installer.report_unresolved``)."""

    def __init__(self, installer: Installer, process: str) -> None:
        self.installer = installer
        self.process = process

    def after(self, state, args, kwargs, result):
        self.installer.catch_up()
        self.installer.report_unresolved(self.process)


class Installer:
    """The one installer: the target table's rows and the rows users' hook files compile to (``userfile``),
    each wrapped the moment its module is imported (now, when it already is), with the same wrappers,
    handlers and runtime control. ``reload()`` re-reads the hook files: entries that are new are installed,
    those gone or changed are turned off; the table's rows stay."""

    def __init__(self, table=None, on_first_load=None, ready_points=None, hook_files=None) -> None:
        """``on_first_load``: called once, before the hooks of the first target module this process loads
        are installed (the instrumentor starts the process's services there: ``recording.services``).
        ``ready_points``: where each kind of process is ready to serve (``READY_POINTS``). ``hook_files``:
        paths of users' hook files (``userfile``; default none)."""
        self.table = tuple(table if table is not None else targets_module.TARGETS)
        self.ready_points = tuple(ready_points if ready_points is not None else READY_POINTS)
        self.hook_files = list(hook_files or ())
        self.patches: list = []
        self.status: dict[str, str] = {}
        #: The hook files' entries as last loaded; entry key -> Patch of its installed hook; keys waiting
        #: for their module.
        self.entries: list[userfile.Entry] = []
        self.file_patches: dict[tuple, Any] = {}
        self.file_pending: set[tuple] = set()
        self.active = False
        self.reported = False  # the never-resolved report of this process is out
        self._lock = threading.RLock()
        self._on_first_load = on_first_load

    def install(self) -> None:
        from wrapt import register_post_import_hook

        self.active = True
        vllm, ascend = vllm_version(), vllm_ascend_version()
        unlisted = supported.unlisted(vllm, ascend)
        if unlisted is not None:  # one line per process: hooked anyway, never refused
            logger.warning("opentelemetry-instrumentation-vllm-ascend: %s", unlisted)
        STATE.streaming_holds_a_slot = in_range(vllm, targets_module.STREAMING_HOLDS_A_SLOT)
        by_module: dict[str, list] = {}
        for target in self.table:
            gate = gate_of(target, vllm, ascend)
            if gate is not None:
                self.status[target.symbol] = gate
                continue
            self.status[target.symbol] = PENDING
            by_module.setdefault(target.module, []).append(target)
        for module_name, rows in by_module.items():
            register_post_import_hook(functools.partial(self._apply, rows=rows), module_name)
        for module_name, qualname, process in self.ready_points:
            register_post_import_hook(
                functools.partial(self._ready_point, qualname=qualname, process=process), module_name
            )
        neighbours.check(self.patches)
        if self.hook_files:
            self._load_hook_files()

    # -- hook files ------------------------------------------------------------------------------------
    def reload(self) -> None:
        """Re-read the hook files (from the calling, normal thread): install new entries, turn off those
        gone or changed."""
        if self.active and self.hook_files:
            logger.info(
                "opentelemetry-instrumentation-vllm-ascend: reloading hook files %s", ", ".join(self.hook_files)
            )
            self._load_hook_files()

    def summary(self) -> dict:
        """The hook files and how many of their entries are in each state (``control status``)."""
        counts: dict[str, int] = {}
        for entry in self.entries:
            counts[entry.status] = counts.get(entry.status, 0) + 1
        return {"files": self.hook_files, **counts}

    def _load_hook_files(self) -> None:
        from wrapt import register_post_import_hook

        entries = userfile.load(self.hook_files, defined=catalogue.EXTRA)
        with self._lock:
            self.entries = entries
            wanted = {e.key: e for e in entries if e.status == userfile.LOADED}
            for key in list(self.file_patches):
                if key not in wanted:
                    _unpatch(self.file_patches.pop(key))
            self.file_pending &= set(wanted)
            for entry in wanted.values():
                for measure in entry.measures:
                    # load() refused any other definition of a metric this process defined before.
                    catalogue.EXTRA[measure.metric] = spec_of(measure)
            by_module: dict[str, list] = {}
            for key, entry in wanted.items():
                if key in self.file_patches or key in self.file_pending:
                    continue
                self.file_pending.add(key)
                by_module.setdefault(entry.module, []).append(entry)
        for module_name, module_entries in by_module.items():
            register_post_import_hook(functools.partial(self._apply, entries=module_entries), module_name)

    def remove_hook_files(self) -> None:
        """Turn off every hook-file hook (the table's stay)."""
        with self._lock:
            for patch in reversed(list(self.file_patches.values())):
                _unpatch(patch)
            self.file_patches.clear()
            self.file_pending.clear()

    def _ready_point(self, module, qualname: str, process: str) -> None:
        """Wrap a ready point (after the module's target hooks, so its wrapper is the outer one)."""
        with self._lock:
            if not self.active:
                return
            owner_name, attribute = qualname.rsplit(".", 1)
            try:
                owner = original_class(module, owner_name)
                self.patches.append(patch_method(owner, attribute, _Ready(self, process), SYNC))
            except Exception as exc:  # never break the host: no report in that process, and say so
                logger.warning(
                    "opentelemetry-instrumentation-vllm-ascend: cannot hook %s:%s (%s: %s); targets that never "
                    "resolve will not be reported in this process, vLLM runs on",
                    module.__name__,
                    qualname,
                    type(exc).__name__,
                    exc,
                )

    def unresolved(self, process: str) -> list[tuple[targets_module.Target, str]]:
        """The targets this process expects that never resolved, each with why: (target, reason). Expected:
        the row's process kind runs here (``process``, and the worker where this process hosts one: its
        ``rank`` label), it is not gated off, and its execution path (``Target.path``) is "" or the one
        taken on its axis (``paths.detect``; where that cannot tell, the one whose targets resolved here).
        Never resolved: hooking failed (a symbol missing), or its module does not exist (a module that exists
        but was never imported belongs to a feature this server does not use, e.g. a KV connector)."""
        from .. import context, paths

        kinds = {process} | ({"worker"} if "rank" in context.PROCESS.labels else set())
        taken = dict(configuration().paths)
        for axis in {paths.BY_KEY[t.path].axis for t in self.table if t.path}:
            if taken.get(axis) is None:
                seen = {
                    t.path
                    for t in self.table
                    if t.path and paths.BY_KEY[t.path].axis == axis and self.status.get(t.symbol) == RESOLVED
                }
                seen -= {paths.BY_KEY[key].extends for key in seen}  # an extending path's rows resolve with its base's
                taken[axis] = seen.pop() if len(seen) == 1 else None
        out = []
        for target in self.table:
            state = self.status.get(target.symbol)
            if target.process not in kinds or state not in (PENDING, MISSING):
                continue
            if target.path and not paths.includes(taken.get(paths.BY_KEY[target.path].axis), target.path):
                continue
            if state == MISSING:
                out.append((target, "cannot be hooked"))
            elif module_exists(target.module) is False:
                out.append((target, f"module {target.module} does not exist"))
        return out

    def catch_up(self) -> int:
        """Put wrapt's import-hook finder back in front of ``sys.meta_path`` and hook now every pending target (and
        hook-file entry) whose module is imported already; the number of modules hooked so. A finder put ahead of
        wrapt's that answers an import itself (ms-service-metric's ``SymbolWatchFinder``, inserted at
        ``sys.meta_path[0]`` by its vLLM plugin, resolves the modules it watches with ``PathFinder``) keeps wrapt
        from seeing that import: our hooks for it would never run, silently. Called where vLLM has loaded its
        plugins (``plugin.register``) and at each ready point; nothing to do (two look-ups) when no finder is
        ahead and no module was missed. Never raises."""
        import sys

        try:
            from wrapt import notify_module_loaded
            from wrapt.importer import ImportHookFinder

            meta_path = sys.meta_path
            mine = next((f for f in meta_path if isinstance(f, ImportHookFinder)), None)
            ahead = []
            if mine is not None and meta_path[0] is not mine:
                index = meta_path.index(mine)
                ahead = [f"{type(f).__module__}.{type(f).__qualname__}" for f in meta_path[:index]]
                meta_path.remove(mine)
                meta_path.insert(0, mine)
            with self._lock:
                if not self.active:
                    return 0
                names = {t.module for t in self.table if self.status.get(t.symbol) == PENDING}
                names |= {e.module for e in self.entries if e.key in self.file_pending}
                names |= {module for module, _qualname, _process in self.ready_points}
            missed = [sys.modules[name] for name in sorted(names) if name in sys.modules]
            hooked = 0
            for module in missed:
                before = sum(1 for t in self.table if self.status.get(t.symbol) == PENDING)
                notify_module_loaded(module)  # runs the post-import hooks still waiting for it (none: nothing)
                hooked += before != sum(1 for t in self.table if self.status.get(t.symbol) == PENDING)
            if ahead or hooked:
                logger.info(
                    "opentelemetry-instrumentation-vllm-ascend: import finder%s ahead of our import hooks: %s; "
                    "put ours first again, %d module%s imported past them hooked now",
                    "s" if len(ahead) != 1 else "",
                    ", ".join(ahead) or "none",
                    hooked,
                    "" if hooked == 1 else "s",
                )
            return hooked
        except Exception:  # never break the host
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: cannot check the import hooks' place", exc_info=True
            )
            return 0

    def report_unresolved(self, process: str) -> None:
        """Once per process, when vLLM is ready to serve: one log line naming each target this process
        expects that never resolved, and the metrics lost with it."""
        if self.reported or not self.active:
            return
        self.reported = True
        try:
            found = self.unresolved(process)
        except Exception as exc:  # never break the host
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: cannot tell which targets never resolved (%s)", exc
            )
            return
        if found:
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: vLLM is ready to serve in this %s process, but %d "
                "hook target(s) it expects never resolved: %s; vLLM runs on without those metrics",
                process,
                len(found),
                "; ".join(
                    f"{target.symbol} ({why}; metrics lost: {', '.join(target.feeds) or '(none; context only)'})"
                    for target, why in found
                ),
            )

    def _apply(self, module, rows=(), entries=()) -> None:
        """Wrap ``module``'s table ``rows`` and hook-file ``entries`` (its post-import hook)."""
        with self._lock:
            if not self.active:
                return
            first_load, self._on_first_load = self._on_first_load, None
            if first_load is not None:
                first_load()
            for entry in entries:
                self._apply_entry(module, entry)
            for target in rows:
                if self.status.get(target.symbol) != PENDING:
                    continue
                try:
                    if target.kind == SCOPE_FACTORY:
                        self.patches.append(load_handler(target).install(module))
                        self.status[target.symbol] = RESOLVED
                        continue
                    owner = module if target.owner_qualname is None else original_class(module, target.owner_qualname)
                    if target.kind == FUTURE_CLASS:
                        # vLLM's FutureWrapper is completed in result(), after collective_rpc returned.
                        self.patches.extend(hook_future_class(owner, completes_later=True))
                    else:
                        handler = load_handler(target)
                        patch = patch_method(owner, target.attribute, handler, target.kind)
                        self.patches.append(patch)
                        keep = target.provides_context or (target.feeds_traces and traces_enabled())
                        control.register(patch.hook, target.feeds, keep)
                    self.status[target.symbol] = RESOLVED
                except Exception as exc:  # never break the host
                    self.status[target.symbol] = MISSING
                    logger.warning(
                        "opentelemetry-instrumentation-vllm-ascend: cannot hook %s (%s: %s); metrics %s "
                        "will not be recorded, vLLM runs on",
                        target.symbol,
                        type(exc).__name__,
                        exc,
                        ", ".join(target.feeds) or "(none)",
                    )
            neighbours.check(self.patches)  # one warning per process, once another vLLM instrumentation is seen

    def _apply_entry(self, module, entry) -> None:
        """A hook-file entry: its row (wrapper kind and parameters from the function it names), its handler,
        the same wrapper and runtime control as a table row; a failure rejects the entry, logged."""
        if entry.key not in self.file_pending:
            return
        self.file_pending.discard(entry.key)
        try:
            owner, attribute, function = userfile.function_of(module, entry)
            row = userfile.row_of(entry, function)
            handler = load_handler(row)
            handler.name = f"user hook {entry.symbol}"
            patch = patch_method(owner, attribute, handler, row.kind)
            self.file_patches[entry.key] = patch
            control.register(patch.hook, feeds=row.feeds)
        except Exception as exc:  # never break the host
            userfile.reject(entry, f"cannot hook: {type(exc).__name__}: {userfile.short(exc)}")

    def uninstall(self) -> None:
        self.remove_hook_files()
        with self._lock:
            self.active = False
            for patch in reversed(self.patches):
                _unpatch(patch)
            self.patches.clear()
            for symbol, state in self.status.items():
                if state in (RESOLVED, PENDING):
                    self.status[symbol] = PENDING


def _unpatch(patch) -> None:
    """Take one installed patch off, its hook out of runtime control first (a future class's patches have none)."""
    hook = getattr(patch, "hook", None)
    if hook is not None:
        control.unregister(hook)
    patch.remove()
