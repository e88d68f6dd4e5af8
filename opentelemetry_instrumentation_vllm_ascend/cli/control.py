"""``python -m opentelemetry_instrumentation_vllm_ascend control {on,off,status,reload} [--metrics PATTERN …]
[--server PID]``

Switches recording of a running instrumented vLLM server on or off (all metrics, or the metrics
matching ``--metrics`` patterns such as ``scheduler:*``), re-reads its hook files (``reload``), or
shows each of its processes (``status``: with the hooks whose handlers failed there, ``hook_errors``).
It writes the server's control file in the server's private directory (recording/control.py); every
process of the server applies it within one export interval and reports back. Only servers of the
calling user are found; with several, ``--server PID`` (the server's first process, or any of its
processes) chooses one.

- ``off``: nothing is recorded (``--metrics P…``: the metrics matching P are added to those off);
- ``on``: everything records again (``--metrics P…``: only those patterns are taken off the off list);
- ``reload``: every process re-reads OTEL_VLLM_ASCEND_CONFIG's files and installs new entries."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

ACTIONS = ("on", "off", "status", "reload")


def add_parser(sub) -> None:
    parser = sub.add_parser("control", help="switch a running server's recording on/off, reload hook files")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--metrics", nargs="+", metavar="PATTERN", help="metric names or shell-style patterns")
    parser.add_argument("--server", type=int, metavar="PID", help="the server (any of its process ids)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--wait", type=float, default=None, help="seconds to wait for every process (default: 3 intervals)"
    )


def servers(parent: str | None = None) -> list[dict]:
    """The instrumented servers of this user on this host: their private directories whose first
    process still runs, with each live process's last status."""
    from ..recording import control
    from ..recording.metrics_endpoint import DIRECTORY_PREFIX, owner_running, read_owner

    parent = parent or tempfile.gettempdir()
    out: list[dict] = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return out
    for name in names:
        path = os.path.join(parent, name)
        if not name.startswith(DIRECTORY_PREFIX) or not control.private(path):
            continue
        owner = read_owner(path)
        if owner is None or not owner_running(*owner):
            continue  # its first process is gone (or the pid was reused): not a server
        root = owner[0]
        processes = _statuses(path)
        if not processes:
            continue  # not (yet) answering control: an older version, or still starting
        out.append({"root": root, "directory": path, "processes": processes, "control": control.read_control(path)})
    return out


def _statuses(path: str) -> list[dict]:
    from ..recording import control
    from ..recording.identity import process_identity

    out = []
    for name in sorted(os.listdir(path)):
        if not (name.startswith(control.STATUS_PREFIX) and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(path, name)) as f:
                status = json.load(f)
            pid = int(status["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if process_identity(pid) is None:
            continue  # exited
        out.append(status)
    return out


def choose(found: list[dict], pid: int | None) -> dict:
    if pid is not None:
        for server in found:
            if server["root"] == pid or any(p.get("pid") == pid for p in server["processes"]):
                return server
        raise SystemExit(f"no instrumented server of this user has process {pid}")
    if not found:
        raise SystemExit("no instrumented vLLM server of this user runs on this host")
    if len(found) > 1:
        listing = ", ".join(str(s["root"]) for s in found)
        raise SystemExit(f"{len(found)} instrumented servers run ({listing}): choose one with --server PID")
    return found[0]


def run_control(args) -> int:
    from ..recording import control

    found = servers()
    if args.action == "status" and args.server is None and len(found) != 1:
        if not found:
            print("no instrumented vLLM server of this user runs on this host")
            return 1
        for server in found:
            _print_server(server, args.json)
        return 0
    try:
        server = choose(found, args.server)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.action == "status":
        _print_server(server, args.json)
        return 0
    current = server["control"] or {"state": "on", "off_metrics": [], "reload": 0, "serial": 0}
    off = list(current.get("off_metrics", []))
    if args.action == "off":
        if args.metrics:
            off += [p for p in args.metrics if p not in off]
        else:
            current["state"] = "off"
    elif args.action == "on":
        if args.metrics:
            off = [p for p in off if p not in args.metrics]
        else:
            current["state"], off = "on", []
    else:
        current["reload"] = int(current.get("reload", 0)) + 1
    current["off_metrics"] = off
    serial = current["serial"] = int(current.get("serial", 0)) + 1
    control.write_control(server["directory"], current)
    wait = args.wait if args.wait is not None else 3 * control.interval_s() + 1
    deadline = time.monotonic() + wait
    while True:
        processes = _statuses(server["directory"])
        behind = [p for p in processes if int(p.get("serial", 0)) < serial]
        if not behind or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    server["processes"], server["control"] = processes, current
    _print_server(server, args.json)
    if behind:
        print(f"{len(behind)} process(es) did not apply it within {wait:.0f} s", file=sys.stderr)
        return 1
    return 0


def _print_server(server: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(server, indent=2))
        return
    control = server.get("control") or {}
    off = control.get("off_metrics") or []
    print(
        f"server {server['root']} ({server['directory']}): recording {control.get('state', 'on')}"
        + (f", off for {', '.join(off)}" if off else "")
    )
    now = time.time()
    for p in server["processes"]:
        files = p.get("hook_files") or {}
        entries = ", ".join(f"{n} {k}" for k, n in sorted(files.items()) if k != "files") or "no hook files"
        last = p.get("last_export")
        age = f"{now - last:.1f} s ago" if last else "never"
        kind = p.get("process", "?")
        if kind == "unknown" and p.get("title"):  # vLLM's DP coordinator, the parent of several API servers
            kind = f"unknown ({p['title']})"
        print(
            f"  pid {p['pid']:>7}  {kind:<11} dp={p.get('dp', '?')} role={p.get('role', '?')} "
            f"state={p.get('state', '?')}  hook-file entries: {entries}  last export: {age}"
        )
        degraded = p.get("degraded_hooks") or []
        if degraded:
            listing = ", ".join(f"{d['hook']} in {d['where']} (x{d['failures']})" for d in degraded)
            print(f"           degraded hooks: {listing}  (docs/deploy.md#vllmascendhookdegraded)")


def print_entries(rows: list[dict]) -> None:
    """``check --config``: one line per hook-file entry (loaded, mapped, gated, rejected; "with differences" where
    it differs from ms-service-metric), then one line per difference."""
    print("Hook files:")
    for r in rows:
        where = f"{r['file']}" + (f":{r['entry']}" if r["entry"] else "")
        differences = (r.get("differences") or []) if r["status"] != "rejected" else []
        verdict = r["status"] + (" with differences" if differences else "")
        print(f"  {where}  {r['symbol'] or '(no symbol)'}  {verdict}: {r['reason']}")
        for difference in differences:
            print(f"      differs: {difference}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("entries: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"))
