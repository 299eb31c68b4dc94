"""The tuning database: records that travel between machines.

A record is keyed by a kernel's structural hash (what the generated code depends on) plus the
target's *features* (backend, arch, vector width, ISA: never a machine name), and holds the tuned
parameters per stage. The file is JSON lines; ``FORMAT_VERSION`` invalidates old records. Records
whose key or features do not match are ignored, never misapplied.

Several processes may tune into one file at once: ``save`` takes the file's lock, merges what
is on disk (the faster record per key wins; lines of other format versions are kept) and
replaces the file whole (``config.atomic_write``), so no writer loses another's records and an
interrupted one (Ctrl-C) leaves the previous file. Readers need no lock.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import atomic_write, file_lock

FORMAT_VERSION = 1


@dataclass(frozen=True)
class TuningRecord:
    kernel_hash: str
    features: dict
    params: dict  # stage index (as str) -> {"mr": .., "nr": ..}
    seconds: float  # measured time of the tuned kernel
    baseline_seconds: float  # the default rule's time, same run
    format_version: int = FORMAT_VERSION

    def key(self) -> tuple[str, str]:
        return self.kernel_hash, feature_key(self.features)


def with_bucket(features: dict, bucket: str) -> dict:
    """The features a record is keyed by: a symbolic kernel's also name its size bucket."""
    return dict(features, sizes=bucket) if bucket else features


def feature_key(features: dict) -> str:
    return json.dumps(features, sort_keys=True)


def _well_formed(rec: TuningRecord) -> bool:
    return (isinstance(rec.kernel_hash, str) and isinstance(rec.features, dict)
            and isinstance(rec.params, dict)
            and all(isinstance(v, dict) and str(k).isdigit() for k, v in rec.params.items())
            and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                    for t in (rec.seconds, rec.baseline_seconds)))


class TuningDB:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self.records: dict[tuple[str, str], TuningRecord] = {}
        self.foreign: set[str] = set()  # lines of other format versions, written back as read
        self.replaced: dict[tuple[str, str], TuningRecord] = {}  # kept over the file's on save
        if self.path:
            self._load(self.path)

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                version = data.get("format_version") if isinstance(data, dict) else None
                rec = TuningRecord(**data) if version == FORMAT_VERSION else None
                if rec is not None and not _well_formed(rec):
                    continue
            except (ValueError, TypeError, AttributeError, RecursionError):
                continue  # a damaged line is skipped, never misread
            if rec is not None:
                self.add(rec)
            elif isinstance(version, int):
                self.foreign.add(line)

    def add(self, rec: TuningRecord) -> None:
        old = self.records.get(rec.key())
        if old is None or rec.seconds < old.seconds:
            self.records[rec.key()] = rec

    def replace(self, rec: TuningRecord) -> None:
        """Put ``rec`` in place of its key's record whatever their times: a choice made by
        another measure (inside the model's graph, ``graph_tune``), kept over the file's
        records when saved."""
        self.records[rec.key()] = rec
        self.replaced[rec.key()] = rec

    def lookup(self, kernel_hash: str, features: dict) -> dict[int, dict] | None:
        rec = self.records.get((kernel_hash, feature_key(features)))
        return None if rec is None else {int(k): v for k, v in rec.params.items()}

    def save(self, path: str | Path | None = None) -> Path:
        """Merge with the records on disk (other processes may have saved meanwhile) and
        replace the file, under its lock."""
        path = Path(path or self.path)
        with file_lock(path):
            self._load(path)
            self.records.update(self.replaced)
            lines = sorted(json.dumps(asdict(r), sort_keys=True) for r in self.records.values())
            lines += sorted(self.foreign)
            atomic_write(path, "".join(line + "\n" for line in lines).encode())
        return path

    def __len__(self) -> int:
        return len(self.records)
