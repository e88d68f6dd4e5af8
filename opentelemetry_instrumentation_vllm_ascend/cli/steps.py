"""``python -m opentelemetry_instrumentation_vllm_ascend steps``: the per-step records (docs/steps.md), live.

Reads the stream from ZMQ endpoints (``--zmq tcp://host:port``, repeatable: one per DP rank, as the EngineCores
bind them) or JSON-lines files (``--file PATH``, repeatable; ``--follow`` keeps reading what is appended), and
shows a table that refreshes: per DP rank, steps/s, step time p50 / p99 and queue depth, then the same per batch
shape (prefill / decode / mixed, scheduled tokens in power-of-two buckets). ``--once`` prints one table (files:
read to their end; ZMQ: after ``--seconds``, default 1); ``--seconds N`` stops after N seconds; ``--plot FILE``
writes an SVG of step time against batch tokens and queued requests at the end. The arithmetic is
steps_stats.py's."""

from __future__ import annotations

import json
import os
import sys
import time

from .steps_stats import Window, point, render, rows

CLEAR = "\x1b[H\x1b[2J"


def add_parser(sub) -> None:
    p = sub.add_parser("steps", help="show the per-step records live (docs/steps.md)")
    p.add_argument("--zmq", action="append", default=[], metavar="ENDPOINT", help="a ZMQ PUB endpoint (repeatable)")
    p.add_argument("--file", action="append", default=[], metavar="PATH", help="a JSON-lines file (repeatable)")
    p.add_argument("--follow", action="store_true", help="keep reading what is appended to the files")
    p.add_argument("--once", action="store_true", help="print one table and stop")
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between two tables (default 1)")
    p.add_argument("--window", type=float, default=0.0, help="only the last SECONDS of steps per rank (default all)")
    p.add_argument("--plot", metavar="FILE", help="at the end, write an SVG of step time vs batch tokens and queue")


class FileSource:
    """JSON lines from ``path``, from its start; ``poll`` returns the records of the complete lines added since
    the last call (a file rotated away, or replaced, is reopened from its start)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = open(path, encoding="utf-8")  # noqa: SIM115 (closed by close())
        self.inode = os.fstat(self.file.fileno()).st_ino
        self.partial = ""
        self.bad = 0

    def poll(self, timeout_s: float = 0.0) -> list[dict]:
        out = []
        while True:
            chunk = self.file.read(1 << 20)
            if not chunk:
                break
            lines = (self.partial + chunk).split("\n")
            self.partial = lines.pop()
            for line in lines:
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        self.bad += 1
        try:
            if os.stat(self.path).st_ino != self.inode:  # rotated: the new file from its start
                self.file.close()
                self.file = open(self.path, encoding="utf-8")  # noqa: SIM115
                self.inode = os.fstat(self.file.fileno()).st_ino
                self.partial = ""
        except OSError:
            pass
        if not out and timeout_s:
            time.sleep(timeout_s)
        return out

    def close(self) -> None:
        self.file.close()


class ZmqSource:
    """A SUB socket connected to each endpoint (the empty topic); ``poll`` returns the records that arrived within
    ``timeout_s``. ``gaps`` counts the messages a sequence number skipped (lost between the socket and here)."""

    def __init__(self, endpoints: list[str]) -> None:
        import msgspec
        import zmq

        self.zmq = zmq
        self.decode = msgspec.msgpack.Decoder().decode
        self.context = zmq.Context()
        self.sockets = []
        self.poller = zmq.Poller()
        for endpoint in endpoints:
            sock = self.context.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.connect(endpoint)
            self.sockets.append(sock)
            self.poller.register(sock, zmq.POLLIN)
        self.last_seq: dict = {}
        self.gaps = 0
        self.bad = 0

    def poll(self, timeout_s: float = 0.0) -> list[dict]:
        out: list[dict] = []
        zmq = self.zmq
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        for sock in self.sockets:
            if sock not in ready:
                continue
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    _topic, seq_bytes, payload = frames
                    record = self.decode(payload)
                except Exception:
                    self.bad += 1
                    continue
                seq = int.from_bytes(seq_bytes, "big")
                last = self.last_seq.get(id(sock))
                if last is not None and seq > last + 1:
                    self.gaps += seq - last - 1
                self.last_seq[id(sock)] = seq
                out.append(record)
        return out

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.context.term()


def table_text(window: Window, sources: list) -> str:
    points = window.points()
    lines = render(rows(points)) if points else ["(no step record yet)"]
    notes = []
    bad = sum(getattr(s, "bad", 0) for s in sources)
    gaps = sum(getattr(s, "gaps", 0) for s in sources)
    if bad:
        notes.append(f"{bad} unreadable")
    if gaps:
        notes.append(f"{gaps} lost in transit (sequence gaps)")
    head = f"{len(points)} steps" + (f"; {', '.join(notes)}" if notes else "")
    return "\n".join([head, *lines])


def run_steps(args, out=None) -> int:
    out = out or sys.stdout
    if not args.zmq and not args.file:
        print("steps: give --zmq ENDPOINT or --file PATH", file=sys.stderr)
        return 2
    sources: list = []
    try:
        for path in args.file:
            sources.append(FileSource(path))
        if args.zmq:
            sources.append(ZmqSource(args.zmq))
    except ImportError as exc:
        print(f"steps: --zmq needs pyzmq and msgspec ({exc})", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"steps: {exc}", file=sys.stderr)
        return 2
    window = Window(args.window)
    live = not args.once and (args.follow or bool(args.zmq))
    seconds = args.seconds if args.seconds is not None else (1.0 if args.once and args.zmq else None)
    deadline = time.monotonic() + seconds if seconds is not None else None
    redraw = time.monotonic() + args.interval
    clear = CLEAR if getattr(out, "isatty", lambda: False)() else ""
    try:
        while True:
            got = 0
            for source in sources:
                now = time.time()
                for record in source.poll(0.05 if live or args.zmq else 0.0):
                    window.add(point(record, now))
                    got += 1
            now_m = time.monotonic()
            finished = deadline is not None and now_m >= deadline
            if not live and not args.zmq and not got:
                finished = True  # files read to their end
            if finished:
                break
            if live and not args.once and now_m >= redraw:
                out.write(clear + table_text(window, sources) + "\n\n")
                out.flush()
                redraw = now_m + args.interval
    except KeyboardInterrupt:
        pass
    finally:
        for source in sources:
            source.close()
    out.write(clear + table_text(window, sources) + "\n")
    if args.plot:
        from .steps_plot import svg

        with open(args.plot, "w", encoding="utf-8") as f:
            f.write(svg(window.points()))
    return 0
