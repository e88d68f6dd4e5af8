"""The ``steps`` command's arithmetic (no I/O): a step record reduced to a ``Point``, the batch-shape buckets,
percentiles and the table's rows. Each number is defined here once:

- step time: the record's ``wall_time`` (``schedule()``'s call to ``update_from_output()``'s return);
- percentiles: nearest rank (the smallest value with at least q % of the values at or below it: always a step
  time that was measured, never an interpolation);
- steps/s: (steps − 1) / (the last step's start − the first's), over the records kept (``--window``);
- batch tokens: the tokens the step scheduled, ``sum_prefill_tokens`` + ``otel_vllm_ascend.sum_decode_tokens``
  (a record without our extension, Dynamo's own: one token per decode request), bucketed by powers of two;
- shape: ``prefill`` (only prefill requests), ``decode`` (only decode requests), ``mixed`` (both);
- queued: the requests waiting after the step, ``queued_requests``' prefill + decode counts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

EXTENSION = "otel_vllm_ascend"
SHAPES = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class Point:
    """What the table and the plot need of one record."""

    dp: int
    t: float  # the step's start (seconds since the epoch; the time it arrived for a record without it)
    wall: float  # seconds
    tokens: int
    shape: str
    queued: int


def point(record: dict, arrived: float) -> Point:
    scheduled = record.get("scheduled_requests") or {}
    queued = record.get("queued_requests") or {}
    extension = record.get(EXTENSION) or {}
    prefills = int(scheduled.get("num_prefill_requests", 0))
    decodes = int(scheduled.get("num_decode_requests", 0))
    decode_tokens = extension.get("sum_decode_tokens")
    tokens = int(scheduled.get("sum_prefill_tokens", 0)) + int(decodes if decode_tokens is None else decode_tokens)
    start = extension.get("start_time_unix")
    return Point(
        dp=int(record.get("dp_rank", -1)),
        t=float(arrived if start is None else start),
        wall=float(record.get("wall_time", 0.0)),
        tokens=tokens,
        shape=shape(prefills, decodes),
        queued=int(queued.get("num_prefill_requests", 0)) + int(queued.get("num_decode_requests", 0)),
    )


def shape(prefills: int, decodes: int) -> str:
    if prefills and decodes:
        return "mixed"
    return "prefill" if prefills else "decode"


def bucket(tokens: int) -> tuple[int, int]:
    """The power-of-two bucket (low, high) holding ``tokens``: 0 → (0, 0), 1 → (1, 1), 2 → (2, 2),
    3..4 → (3, 4), 5..8 → (5, 8), …"""
    if tokens <= 0:
        return (0, 0)
    high = 1 << (tokens - 1).bit_length()
    return (high // 2 + 1 if high > 2 else high, high)


def bucket_label(low: int, high: int) -> str:
    return str(high) if low == high else f"{low}-{high}"


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the ⌈q/100 · n⌉-th smallest value (q in (0, 100]); NaN for no value."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def rate(times: list[float]) -> float:
    """Steps per second: (n − 1) / (last − first) of the steps' start times; NaN below two steps or no time."""
    if len(times) < 2:
        return math.nan
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else math.nan


@dataclass(frozen=True)
class Row:
    dp: int
    shape: str  # "all" for the rank's row
    tokens: str  # the bucket's label ("" for the rank's row)
    steps: int
    rate: float
    p50: float  # seconds
    p99: float
    queued_mean: float
    queued_max: int


def _row(dp: int, shape_: str, tokens: str, points: list[Point]) -> Row:
    walls = [p.wall for p in points]
    queued = [p.queued for p in points]
    return Row(
        dp=dp,
        shape=shape_,
        tokens=tokens,
        steps=len(points),
        rate=rate([p.t for p in points]),
        p50=percentile(walls, 50),
        p99=percentile(walls, 99),
        queued_mean=sum(queued) / len(queued),
        queued_max=max(queued),
    )


def rows(points: list[Point]) -> list[Row]:
    """Per DP rank (ascending): its row (``shape="all"``), then one per (shape, token bucket) it had, in
    ``SHAPES`` order and ascending buckets."""
    by_rank: dict[int, list[Point]] = {}
    for p in points:
        by_rank.setdefault(p.dp, []).append(p)
    out = []
    for dp in sorted(by_rank):
        mine = by_rank[dp]
        out.append(_row(dp, "all", "", mine))
        groups: dict[tuple, list[Point]] = {}
        for p in mine:
            groups.setdefault((SHAPES.index(p.shape), bucket(p.tokens)), []).append(p)
        for (index, (low, high)), group in sorted(groups.items()):
            out.append(_row(dp, SHAPES[index], bucket_label(low, high), group))
    return out


class Window:
    """The points kept: per DP rank the last ``max_points``, and (``seconds`` > 0) only those that started within
    ``seconds`` of that rank's newest."""

    def __init__(self, seconds: float = 0.0, max_points: int = 200_000) -> None:
        self.seconds = seconds
        self.max_points = max_points
        self.ranks: dict[int, deque] = {}

    def add(self, p: Point) -> None:
        kept = self.ranks.get(p.dp)
        if kept is None:
            kept = self.ranks[p.dp] = deque(maxlen=self.max_points)
        kept.append(p)
        if self.seconds > 0:
            while kept and kept[0].t < p.t - self.seconds:
                kept.popleft()

    def points(self) -> list[Point]:
        return [p for dp in sorted(self.ranks) for p in self.ranks[dp]]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def _per_s(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


HEADER = ("dp", "shape", "tokens", "steps", "steps/s", "p50 ms", "p99 ms", "queued", "queued max")


def render(table: list[Row]) -> list[str]:
    """The table as aligned text lines (a header, then one line per row)."""
    cells = [HEADER] + [
        (
            str(r.dp) if r.shape == "all" else "",
            r.shape,
            r.tokens,
            str(r.steps),
            _per_s(r.rate),
            _ms(r.p50),
            _ms(r.p99),
            f"{r.queued_mean:.1f}",
            str(r.queued_max),
        )
        for r in table
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return [
        "  ".join(c[i].rjust(widths[i]) if i > 2 else c[i].ljust(widths[i]) for i in range(len(c))).rstrip()
        for c in cells
    ]
