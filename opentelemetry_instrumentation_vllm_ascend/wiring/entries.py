"""A hook-file entry (``wiring/userfile.py``): its states, the format's keys, types and bounds, and the checks of
its values (a version, a bucket list, an installed version against the entry's range)."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from .. import catalogue
from .declarative import COUNTER, GAUGE, HISTOGRAM, TIMER, Measure

LOADED, MAPPED, GATED, REJECTED = "loaded", "mapped", "gated", "rejected"


#: The ``type:`` of a metric: the declarative measure kinds (a ``histogram`` without ``expr`` is a timer
#: with the histogram's default buckets).
TYPES = (TIMER, HISTOGRAM, COUNTER, GAUGE)
ENTRY_KEYS = frozenset({"symbol", "handler", "metrics", "min_version", "max_version", "lock_patch", "need_locals"})
#: Keys of the incumbent's entries accepted with a fixed meaning (see ``_entry``).
ENTRY_COMPAT_KEYS = frozenset({"type", "enabled"})
METRIC_KEYS = frozenset({"name", "type", "expr", "buckets", "labels"})
#: Labels every series gets from the process / step: a user label may not take these names.
RESERVED_LABELS = frozenset({"dp", "role", "phase", "rank", "process", "le", "quantile"})
MAX_LABELS = 4
MAX_BUCKETS = 64
MAX_ENTRIES = 256
MAX_FILE_BYTES = 1 << 20
#: Default bounds of a ``timer`` (seconds: 1 µs … 5 min) and of a ``histogram`` without ``buckets``.
TIMER_BUCKETS = catalogue.FINE_SECONDS + (30.0, 60.0, 120.0, 300.0)
HISTOGRAM_BUCKETS = catalogue.TOKENS


@dataclass
class Entry:
    file: str
    index: int  # 1-based position in its file (0: the file itself)
    symbol: str = ""
    status: str = REJECTED
    reason: str = ""
    #: ``targets.Measure`` per metric of the entry that is not a built-in one.
    measures: tuple[Measure, ...] = ()
    min_version: str | None = None
    max_version: str | None = None
    lock_patch: bool = False
    #: Something in the entry is ignored that its author may rely on: its log line is a warning.
    warning: bool = False
    #: What differs from ms-service-metric for this entry, each in words (type, buckets, labels, hook point,
    #: what is timed, opt-in state, phase).
    differences: tuple[str, ...] = ()

    @property
    def key(self) -> tuple:
        """What the entry installs: equal keys, the same hook (expressions compare by source; the
        measures carry their metrics' specs, buckets and labels included)."""
        return (self.symbol, self.measures)

    @property
    def where(self) -> str:
        return f"{self.file}" + (f" entry {self.index}" if self.index else "")

    @property
    def module(self) -> str:
        return self.symbol.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.symbol.split(":", 1)[1]

    def as_row(self) -> dict:
        return {
            "file": self.file,
            "entry": self.index,
            "symbol": self.symbol,
            "status": self.status,
            "reason": self.reason,
            "metrics": [catalogue.PREFIX + m.metric for m in self.measures],
            "differences": list(self.differences),
        }

    @property
    def verdict(self) -> str:
        """The status as ``check --config`` and the log say it: ``mapped with differences`` where any."""
        return self.status + (" with differences" if self.differences and self.status != REJECTED else "")


def short(exc) -> str:
    """An exception's text on one line, at most 200 characters (what an entry's reason quotes)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:200] + "…"


def version_of(value, key: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError(f"{key} must be a version string, not {type(value).__name__}")
    try:
        Version(str(value))
    except InvalidVersion:
        raise ValueError(f"{key} {value!r} is not a version") from None
    return str(value)


def buckets_of(value) -> tuple:
    if not isinstance(value, list) or not value:
        raise ValueError("buckets must be a non-empty list of numbers")
    if len(value) > MAX_BUCKETS:
        raise ValueError(f"more than {MAX_BUCKETS} buckets")
    if any(
        isinstance(b, bool) or not isinstance(b, (int, float)) or b != b or b in (float("inf"), float("-inf"))
        for b in value
    ):
        raise ValueError("buckets must be finite numbers")
    if any(later <= earlier for earlier, later in zip(value, value[1:])):
        raise ValueError("buckets must be strictly increasing")
    return tuple(float(b) for b in value)


def within(version, min_version: str | None, max_version: str | None) -> bool:
    """Whether the installed ``version`` is within an entry's bounds, both inclusive (unknown: yes). A bound that is
    a pre-release is compared with the installed pre-release itself (``max_version: 0.13.0rc1`` keeps 0.13.0rc1);
    a final bound with the installed release (0.13.0rc1 counts as 0.13.0, as the target table counts it)."""
    if version is None:
        return True
    for bound, below in ((min_version, False), (max_version, True)):
        if bound is None:
            continue
        limit = Version(bound)
        installed = Version(version.public if limit.is_prerelease else version.base_version)
        if (installed > limit) if below else (installed < limit):
            return False
    return True


def outside(version, vllm, entry: Entry) -> str:
    which = "vLLM" if version is vllm else "vllm-ascend"
    spec = ",".join(
        s for s in (entry.min_version and f">={entry.min_version}", entry.max_version and f"<={entry.max_version}") if s
    )
    return f"{which} {version} is outside {spec}"


class Rejected(Exception):
    """An entry (or one of its metrics) is rejected: the message says why and what to write instead."""
