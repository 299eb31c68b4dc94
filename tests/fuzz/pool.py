"""The parent side: a pool of long-lived worker processes fed cases over pipes.

Each worker (``worker.py``) imports deploy once and answers one case at a time. A worker that
dies during a case (a segfault, an abort, the kernel's OOM killer) is a ``crash`` of that case;
one that runs past the per-case timeout is killed, a ``hang``; both are replaced. Workers are
also recycled every ``recycle`` cases (each compiled library stays mapped in the process that
loaded it). Every worker runs with at most ``memory_gb`` of address space, one OpenMP thread,
and private temporary, cache and tuning-database folders under the run's folder."""
from __future__ import annotations

import collections
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .judge import FAILURES, OUTCOMES
from .seeds import prepare
from .worker import ALL, FAMILIES

STARTUP_TIMEOUT = 180.0  # seconds for a worker to import deploy and say it is ready


@dataclass
class CaseRecord:
    family: str
    index: int
    label: str
    outcome: str
    detail: str
    seconds: float

    @property
    def id(self) -> str:
        return f"{self.family}#{self.index}"


@dataclass
class Report:
    seed: int
    records: list[CaseRecord] = field(default_factory=list)
    wall: float = 0.0

    def counts(self) -> dict[str, collections.Counter]:
        by: dict[str, collections.Counter] = {}
        for r in self.records:
            by.setdefault(r.family, collections.Counter())[r.outcome] += 1
        return by

    def failures(self) -> list[CaseRecord]:
        return [r for r in self.records if r.outcome in FAILURES]

    def table(self) -> str:
        head = ("family", "cases", "errors", "correct", "crashes", "hangs", "silent", "bad msg",
                "seconds")
        rows, total = [], collections.Counter()
        seconds: collections.Counter = collections.Counter()
        for r in self.records:
            seconds[r.family] += r.seconds
        counts = self.counts()
        for fam in [f for f in ALL if f in counts]:
            c = counts[fam]
            total.update(c)
            rows.append((fam, sum(c.values()), *(c[o] for o in OUTCOMES),
                         f"{seconds[fam]:.0f}"))
        rows.append(("total", sum(total.values()), *(total[o] for o in OUTCOMES),
                     f"{sum(seconds.values()):.0f}"))
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
        return "\n".join(lines)

    def as_json(self) -> dict:
        labels: dict = {}
        for r in self.records:
            labels.setdefault(r.family, {}).setdefault(r.label, collections.Counter())[
                r.outcome] += 1
        return {"seed": self.seed, "cases": len(self.records), "wall_seconds": round(self.wall, 1),
                "counts": {f: dict(c) for f, c in self.counts().items()},
                "labels": {f: {k: dict(c) for k, c in sorted(d.items())}
                           for f, d in labels.items()},
                "failures": [r.__dict__ | {"id": r.id} for r in self.failures()]}


class Worker:
    def __init__(self, number: int, seeds: Path, folder: Path, env: dict, memory_gb: float):
        self.log_path = folder / "logs" / f"worker-{number}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # its own process group: killing it takes
            self.proc = subprocess.Popen(  # the C compiler along
                [sys.executable, "-m", "deploy.tests.fuzz.worker", str(seeds), str(memory_gb)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, cwd=folder,
                start_new_session=True)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.buf = b""
        self.ready = False
        self.case: tuple[str, int] | None = None
        self.deadline = time.monotonic() + STARTUP_TIMEOUT
        self.done = 0
        self.log_at = 0

    def send(self, family: str, seed: int, index: int, timeout: float) -> None:
        self.case = (family, index)
        self.log_at = self.log_path.stat().st_size
        self.deadline = time.monotonic() + timeout
        self.proc.stdin.write((json.dumps({"family": family, "seed": seed, "index": index})
                               + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> list[dict] | None:
        """Complete answers so far; None once the worker's stdout closed (it died)."""
        try:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_at)
                return f.read()[-2500:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        self.proc.stdout.close()


def worker_env(folder: Path) -> dict:
    env = dict(os.environ)
    for sub in ("tmp", "cache"):
        (folder / sub).mkdir(exist_ok=True)
    env.update(TMPDIR=str(folder / "tmp"), DEPLOY_CACHE_DIR=str(folder / "cache"),
               DEPLOY_TUNING_DB=str(folder / "tuning.jsonl"), OMP_NUM_THREADS="1",
               DEPLOY_DEBUG=env.get("DEPLOY_DEBUG", "1"), PYTHONFAULTHANDLER="1")
    env.pop("DEPLOY_DUMP_DIR", None)
    return env


def plan(cases: int, families: list[str]) -> list[tuple[str, int]]:
    """Case k of a run goes to family k mod F, as that family's case k // F."""
    return [(families[k % len(families)], k // len(families)) for k in range(cases)]


def run_fuzz(cases: int, seed: int = 0, jobs: int = 2, families: list[str] | None = None,
             timeout: float = 60.0, recycle: int = 250, memory_gb: float = 4.0,
             progress=None, keep: bool = False) -> Report:
    """Run ``cases`` cases over ``families`` (default all) on ``jobs`` workers."""
    families = list(families or FAMILIES)
    start = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="deploy-fuzz-"))
    report = Report(seed)
    try:
        env = worker_env(folder)
        seeds = prepare(folder / "seeds")
        todo = collections.deque(plan(cases, families))
        workers: list[Worker] = []
        started = 0
        sel = selectors.DefaultSelector()

        def start_worker() -> Worker:
            nonlocal started
            started += 1
            w = Worker(started, seeds, folder, env, memory_gb)
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)
            workers.append(w)
            return w

        def retire(w: Worker, killed: bool) -> None:
            sel.unregister(w.proc.stdout)
            workers.remove(w)
            w.kill() if killed else w.stop()

        def record(w: Worker, outcome: str, detail: str, label: str = "?", seconds=None):
            family, index = w.case
            r = CaseRecord(family, index, label, outcome, detail,
                           seconds if seconds is not None else timeout)
            report.records.append(r)
            w.case = None
            w.deadline = float("inf")  # idle until the next case
            w.done += 1
            if progress:
                progress(r, len(report.records), cases)

        for _ in range(min(jobs, len(todo))):
            start_worker()
        failed_starts = 0
        while workers:
            for w in workers:
                if w.ready and w.case is None:
                    if todo and w.done < recycle:
                        family, index = todo.popleft()
                        w.send(family, seed, index, timeout)
                    else:
                        retire(w, killed=False)
                        if todo:
                            start_worker()
            if not workers:
                break
            wait = max(0.0, min(w.deadline for w in workers) - time.monotonic())
            for key, _ in sel.select(timeout=wait):
                w = key.data
                answers = w.read()
                if answers is None:  # the worker died
                    code = w.proc.wait()
                    tail = w.log_tail()
                    retire(w, killed=True)
                    if w.case is None:
                        failed_starts += 1
                        if failed_starts > 3:
                            raise RuntimeError(f"fuzz workers die at start (exit {code}): {tail}")
                    else:
                        how = f"signal {-code}" if code < 0 else f"exit {code}"
                        record(w, "crash", f"the worker died ({how}): {tail}")
                    if todo:
                        start_worker()
                    continue
                for a in answers:
                    if "ready" in a:
                        w.ready = True
                        w.deadline = float("inf")
                    else:
                        record(w, a["outcome"], a["detail"], a["label"], a["seconds"])
            now = time.monotonic()
            for w in workers:
                if w.deadline <= now and (w.case is not None or not w.ready):
                    if w.case is None:
                        raise RuntimeError(f"a fuzz worker did not start in {STARTUP_TIMEOUT} s: "
                                           f"{w.log_tail()}")
                    tail = w.log_tail()
                    retire(w, killed=True)
                    record(w, "hang", f"no answer in {timeout:.0f} s: {tail}")
                    if todo:
                        start_worker()
    finally:
        for w in list(locals().get("workers", [])):
            w.kill()
        if keep:
            print(f"fuzz folder kept: {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    report.records.sort(key=lambda r: (ALL.index(r.family), r.index))
    report.wall = time.monotonic() - start
    return report
