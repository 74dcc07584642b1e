"""Reading prometheus-client's multiprocess ``.db`` files fast enough to scrape often.

``MultiProcessCollector.collect()`` re-parses every key (a JSON document) of every file on every
scrape and builds a ``Sample`` per entry, and ``generate_latest`` then formats each one again:
with 8 engine processes writing vLLM's full metric set that is ~70 ms per scrape on a 2-core
machine (``bench/metrics_scrape.py``). The series a process writes hardly ever change, so this
reader keeps what a key means (names, labels already rendered as exposition text) across scrapes
and only reads the values each time.

The merge rules are MultiProcessCollector's own (prometheus-client 0.26): counters and
summaries are summed over processes; histogram buckets are summed and made cumulative, with
``_count`` being the ``+Inf`` bucket; gauges follow their ``multiprocess_mode`` (from the file
name): ``all``/``liveall`` keep one series per ``pid``, ``min``/``max``/``sum`` and their
``live`` forms combine across processes, ``mostrecent``/``livemostrecent`` keep the value with
the newest timestamp. The output is what ``generate_latest`` writes for the same families
(counters are typed under ``<name>_total``). Tests check it equals MultiProcessCollector's
result on the same files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.utils import floatToGoString

MAX_CACHED_KEYS = 200_000  # far above any real series count; a guard against unbounded growth


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


@dataclass(frozen=True)
class _Key:
    """What one ``.db`` key means, parsed once."""

    metric: str
    sample: str
    labels: tuple[tuple[str, str], ...]  # sorted, without ``le``
    labels_text: str  # 'a="1",b="2"' (no braces), without ``le``
    le: float | None  # the bucket bound of a ``_bucket`` sample
    help: str


@dataclass
class _Family:
    name: str
    type: str
    help: str
    mode: str = ""
    # (sample name, labels text) → value, in first-seen order
    samples: dict[tuple[str, str], float] = field(default_factory=dict)
    timestamps: dict[tuple[str, str], float] = field(default_factory=dict)
    # labels text → {le: summed bucket value}
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)


class MultiprocessReader:
    """Reads a multiprocess directory into one exposition; keep one per directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._keys: dict[str, _Key] = {}

    def _key(self, raw: str) -> _Key:
        key = self._keys.get(raw)
        if key is None:
            metric, sample, labels, help_text = json.loads(raw)
            le = labels.get("le") if sample.endswith("_bucket") else None
            items = tuple(sorted((k, str(v)) for k, v in labels.items() if le is None or k != "le"))
            text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in items)
            key = _Key(metric, sample, items, text, None if le is None else float(le), help_text)
            if len(self._keys) >= MAX_CACHED_KEYS:
                self._keys.clear()
            self._keys[raw] = key
        return key

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.db"))

    def read(self, files: Iterable[Path] | None = None) -> dict[str, _Family]:
        families: dict[str, _Family] = {}
        for path in self.files() if files is None else files:
            parts = path.name.split("_")
            typ = parts[0]
            mode = parts[1] if typ == "gauge" else ""
            pid = parts[-1][: -len(".db")]
            try:
                entries = MmapedDict.read_all_values_from_file(str(path))
            except FileNotFoundError:
                if typ == "gauge" and mode.startswith("live"):
                    continue  # a live gauge's process was marked dead since the glob
                raise
            for raw, value, timestamp, _ in entries:
                key = self._key(raw)
                family = families.get(key.metric)
                if family is None:
                    family = families[key.metric] = _Family(key.metric, typ, key.help, mode)
                self._add(family, key, value, timestamp, pid)
        return families

    @staticmethod
    def _add(family: _Family, key: _Key, value: float, timestamp: float, pid: str) -> None:
        if family.type == "histogram" and key.le is not None:
            by_le = family.buckets.setdefault(key.labels_text, {})
            by_le[key.le] = by_le.get(key.le, 0.0) + value
            return
        if family.type != "gauge":
            slot = (key.sample, key.labels_text)
            family.samples[slot] = family.samples.get(slot, 0.0) + value
            return
        mode = family.mode
        if mode in ("all", "liveall"):
            labels = _sorted_labels(key.labels, ("pid", pid))
            family.samples[(key.sample, labels)] = value
            return
        slot = (key.sample, key.labels_text)
        current = family.samples.get(slot)
        if mode in ("min", "livemin"):
            family.samples[slot] = value if current is None else min(current, value)
        elif mode in ("max", "livemax"):
            family.samples[slot] = value if current is None else max(current, value)
        elif mode in ("sum", "livesum"):
            family.samples[slot] = (current or 0.0) + value
        else:  # mostrecent, livemostrecent
            timestamp = float(timestamp or 0)
            if current is None:
                family.samples[slot] = 0.0
                family.timestamps[slot] = 0.0
            if family.timestamps[slot] < timestamp:
                family.samples[slot] = value
                family.timestamps[slot] = timestamp

    @staticmethod
    def render(families: dict[str, _Family]) -> str:
        out: list[str] = []
        for family in families.values():
            name = family.name + "_total" if family.type == "counter" else family.name
            out.append(f"# HELP {name} {_escape_help(family.help)}\n# TYPE {name} {family.type}\n")
            for (sample, labels), value in family.samples.items():
                out.append(f"{sample}{_braced(labels)} {floatToGoString(value)}\n")
            for labels, by_le in family.buckets.items():
                prefix = f"{family.name}_bucket{{{labels}{',' if labels else ''}le="
                total = 0.0
                for le in sorted(by_le):
                    total += by_le[le]
                    out.append(f'{prefix}"{floatToGoString(le)}"}} {floatToGoString(total)}\n')
                out.append(f"{family.name}_count{_braced(labels)} {floatToGoString(total)}\n")
        return "".join(out)


def _braced(labels: str) -> str:
    return f"{{{labels}}}" if labels else ""


def _sorted_labels(items: tuple[tuple[str, str], ...], extra: tuple[str, str]) -> str:
    return ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted([*items, extra]))


def family_names(families: dict[str, _Family]) -> set[str]:
    """Every name a scraper sees for these families (metric, ``_total``, sample names)."""
    names: set[str] = set()
    for family in families.values():
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        names.update(sample for sample, _ in family.samples)
        if family.buckets:
            names.update((family.name + "_bucket", family.name + "_count"))
    return names
