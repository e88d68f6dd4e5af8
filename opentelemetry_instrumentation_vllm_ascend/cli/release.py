"""``check --vllm VERSION|PATH [--vllm-ascend VERSION|PATH]``: the target table against a release that is not
installed, read from its source (``source.py``; fetched with ``archives.py`` when given a version). Nothing
here imports vLLM."""

from __future__ import annotations

import json
import os
import re
import sys

#: What a version looks like on the command line (anything else must be an existing path).
_VERSION = re.compile(r"^\d+(\.\d+)*([.-]?(a|b|rc|post|dev)\.?\d*)*$")


class UsageError(Exception):
    """A release that cannot be found, fetched or read (exit 2)."""


def _release(project: str, given: str) -> tuple[str, str]:
    """(version, archive or directory) of ``given``: an existing path, else a version fetched from the index."""
    from .. import archives, source

    if os.path.exists(given):
        version = source.release_version(given, project)
        if version is None:
            raise UsageError(
                f"cannot tell which {project} release {given} is (no version in its name, no PKG-INFO, METADATA "
                f"or {project.replace('-', '_')}/_version.py)"
            )
        return version, given
    if not _VERSION.match(given):
        raise UsageError(f"--{project} {given}: neither an existing path nor a version")
    try:
        return given, archives.release_archive(project, given)
    except (OSError, LookupError, RuntimeError, ValueError) as exc:
        raise UsageError(f"cannot fetch {project} {given}: {exc}") from exc


def _vllm_for_ascend(ascend: str) -> str:
    """The vLLM release a vllm-ascend release runs on: its pair in ``supported.VLLM_ASCEND``, else the vLLM
    release of the same number (vllm-ascend numbers its releases after vLLM's)."""
    from packaging.version import Version

    from .. import supported

    paired = dict(supported.VLLM_ASCEND).get(ascend)
    if paired:
        return paired
    return ".".join(str(part) for part in Version(ascend).release[:3])


def release_check(args, overrides: dict) -> int:
    from packaging.version import InvalidVersion, Version

    from .. import paths, source
    from ..version import __version__
    from ..wiring import installer

    try:
        ascend_version = ascend_source = None
        if args.vllm_ascend:
            ascend_version, ascend_source = _release("vllm-ascend", args.vllm_ascend)
        vllm_version, vllm_source = _release("vllm", args.vllm or _vllm_for_ascend(ascend_version or ""))
        vllm, ascend = Version(vllm_version), Version(ascend_version) if ascend_version else None
        files = dict(source.SourceTree.from_path(vllm_source).files)
        if ascend_source is not None:
            files.update(source.SourceTree.from_path(ascend_source).files)
    except (UsageError, InvalidVersion, OSError, ValueError) as exc:
        print(f"check: {exc}", file=sys.stderr)
        return 2
    tree = source.SourceTree(files)
    if tree.module("vllm") is None and tree.module("vllm.v1") is None:
        print(f"check: no vLLM source in {vllm_source}", file=sys.stderr)
        return 2
    hook_files = None
    if getattr(args, "config", None):  # each entry loaded for these releases, its symbol resolved in their source
        from ..wiring import userfile

        entries = resolve_in_source(tree, userfile.load(args.config, vllm, ascend, log=False), ascend is not None)
        hook_files = [e.as_row() for e in entries]
        if not args.json:
            from .control import print_entries

            print_entries(hook_files)  # the verdicts first: what the user asked about
    rejected = any(e["status"] == "rejected" for e in hook_files or ())
    config = paths.detect(vllm, ascend is not None, "vllm", overrides=overrides)
    rows = source.release_rows(tree, vllm, ascend, config)
    metrics = installer.metric_status(rows, config)
    failing = [r for r in rows if r["status"] == installer.MISSING and r["expected"] is not False]
    missing = [
        {
            "symbol": r["symbol"],
            "detail": r["detail"],
            "path": r["path"],
            "expected": r["expected"],
            # what no other resolved target feeds on its path (a row of every path: on the detected worker path)
            "costs": sorted(source.costs(rows, r["path"] or config.paths.get("worker"), [r])),
        }
        for r in failing
    ]
    per_path = source.by_path(rows, config)
    if args.json:
        print(
            json.dumps(
                {
                    "package": __version__,
                    "vllm": vllm_version,
                    "vllm_ascend": ascend_version,
                    "source": {"vllm": vllm_source, "vllm_ascend": ascend_source},
                    "targets": rows,
                    "configuration": {
                        axis: {"path": config.paths[axis], "reason": config.reasons[axis]} for axis in config.paths
                    },
                    "metrics": metrics,
                    "by_path": per_path,
                    "missing": missing,
                    "hook_files": hook_files,
                    "ok": not failing and not rejected,
                },
                indent=2,
            )
        )
        return 1 if failing or rejected else 0
    print(
        f"opentelemetry-instrumentation-vllm-ascend {__version__}; vLLM {vllm_version} (source: {vllm_source}); "
        f"vllm-ascend {ascend_version or 'not given'}" + (f" (source: {ascend_source})" if ascend_source else "")
    )
    width = max(len(r["symbol"]) for r in rows)
    for r in rows:
        feeds = ", ".join(r["feeds"]) or "(context)"
        where = f" [{' / '.join(paths.taking(r['path']))} only]" if r["path"] else ""
        if r["status"] == installer.MISSING and r["expected"] is False:
            where += " (not on the detected path)"
        elif r["expected"] is None:
            where += f" (cannot tell whether the {paths.BY_KEY[r['path']].axis} path is {r['path']})"
        detail = f" — {r['detail']}" if r["detail"] else ""
        print(f"  {r['symbol']:<{width}}  {r['status']:<32} {feeds}{where}{detail}")
    fine = sum(r["status"] == installer.RESOLVED for r in rows)
    print(f"{fine} of {len(rows)} targets resolve; {len(failing)} expected and missing")
    print_metric_verdicts(config, metrics)
    print("By execution path (absent there / measured differently there / lost to missing targets):")
    for key, entry in per_path.items():
        print(
            f"  {key} ({entry['axis']}: {paths.BY_KEY[key].title}): {len(entry['absent'])} absent, "
            f"{len(entry['changed'])} changed, "
            f"{len(entry['lost_to_missing_targets'])} lost"
            + (f": {', '.join(entry['lost_to_missing_targets'])}" if entry["lost_to_missing_targets"] else "")
        )
    for m in missing:
        costs = ", ".join(m["costs"]) or "no metric (another target feeds its metrics)"
        print(f"MISSING {m['symbol']}: {m['detail']}; costs {costs}")
    return 1 if failing or rejected else 0


def resolve_in_source(tree, entries: list, ascend_given: bool) -> list:
    """``check --vllm X --config F``: each loaded entry's symbol looked up in the release's source (``tree``, never
    imported): rejected when it is not there, or when an expression reads a name the function does not have; a
    vllm_ascend symbol without ``--vllm-ascend`` is not resolved (said in its reason)."""
    import ast

    from .. import source
    from ..wiring import userfile

    for entry in entries:
        if entry.status != userfile.LOADED:
            continue
        top = entry.module.split(".")[0]
        if top not in ("vllm", "vllm_ascend"):
            entry.reason += " (not resolved: check reads only vllm and vllm_ascend source)"
            continue
        if top == "vllm_ascend" and not ascend_given:
            entry.reason += " (not resolved: no --vllm-ascend given)"
            continue
        func = None
        if "." in entry.qualname:
            owner, attribute = entry.qualname.rsplit(".", 1)
            found = tree.find_class(entry.module, owner)
            if found is not None:
                func = next(
                    (
                        n
                        for n in found[1].body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attribute
                    ),
                    None,
                )
        else:
            func = source.module_function(tree, entry.module, entry.qualname)
        if func is None:
            entry.status = userfile.REJECTED
            entry.reason = f"cannot hook: {entry.symbol} is not in this release's source"
            continue
        # as inspect.signature names them where it is installed (userfile.row_of): self first for a method
        names = tuple(source.positional_params(func)) + tuple(a.arg for a in func.args.kwonlyargs)
        why = userfile.check_names(entry, names)
        if why is not None:
            entry.status, entry.reason = userfile.REJECTED, f"cannot hook: {why}"
    return entries


def print_metric_verdicts(config, metrics: list[dict]) -> None:
    """The execution paths taken and each metric's verdict on them, with the count per verdict (``check``,
    installed or ``--vllm``)."""
    print("Execution paths:")
    for axis, key in config.paths.items():
        print(f"  {axis}: {key or 'cannot tell'} ({config.reasons[axis]})")
    width = max(len(m["metric"]) for m in metrics)
    for m in metrics:
        detail = f" — {m['detail']}" if m["detail"] else ""
        print(f"  {m['metric']:<{width}}  {m['status']}{detail}")
    counts: dict[str, int] = {}
    for m in metrics:
        counts[m["status"]] = counts.get(m["status"], 0) + 1
    print("metrics: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
