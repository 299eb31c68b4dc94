"""The tuning database: records that travel between machines.

A record is keyed by a kernel's structural hash (what the generated code depends on) plus the
target's *features* (backend, arch, vector width, ISA: never a machine name), and holds the tuned
parameters per stage. The file is JSON lines; ``FORMAT_VERSION`` invalidates old records. Records
whose key or features do not match are ignored, never misapplied.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

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


class TuningDB:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self.records: dict[tuple[str, str], TuningRecord] = {}
        if self.path and self.path.exists():
            self._load()

    def _load(self) -> None:
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                rec = TuningRecord(**data)
            except (json.JSONDecodeError, TypeError):
                continue  # a damaged or foreign line is skipped, never misread
            if rec.format_version == FORMAT_VERSION:
                self.add(rec)

    def add(self, rec: TuningRecord) -> None:
        old = self.records.get(rec.key())
        if old is None or rec.seconds < old.seconds:
            self.records[rec.key()] = rec

    def lookup(self, kernel_hash: str, features: dict) -> dict[int, dict] | None:
        rec = self.records.get((kernel_hash, feature_key(features)))
        return None if rec is None else {int(k): v for k, v in rec.params.items()}

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path or self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(asdict(r), sort_keys=True) for r in self.records.values()]
        path.write_text("\n".join(lines) + ("\n" if lines else ""))
        return path

    def __len__(self) -> int:
        return len(self.records)
