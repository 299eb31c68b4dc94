"""The tuning driver on Ray: searches spread over measuring workers, records merged here.

Workers (Ray actors, ``Worker``) measure; on CPU targets each pins itself to its own cores
(``tune_cores``, claimed with a lock file per core on its node) and compiles its own batches
there, so compiling on one worker overlaps measuring on the others and no core does two
things. On GPU targets each worker holds one GPU (``num_gpus=1``) and a pool of CPU tasks
compiles the batches ahead of it (a compiled backlog of ``DEPTH`` per worker), a task per
piece of a batch (``job.split``: one candidate each), so one kernel's candidates compile on
as many CPUs; the worker gets every piece's result and measures the batch once all are in.

The driver keeps ``DEPTH`` tasks queued on every worker (the next starts as one ends), takes
each result, asks the kernel's search for its next batch, and on a finished search merges its
record into the database and saves it: a driver restarted with the same file skips those
kernels. Faults: Ray restarts a worker that dies (``max_restarts``) and retries its task there
(``max_task_retries``); once a worker is out of restarts, its tasks go to another worker. A
compile task is retried ``max_retries`` times. Only the lost task is measured again.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import DeployError, UsageError
from ...progress import tuning_step
from ...tensor_ir.tuning_db import TuningDB
from .job import TuneReport, TuningJob, agreement, describe, finish

DEPTH = 2  # tasks queued per worker
RESTARTS = 3  # a worker's restarts (Ray's max_restarts) and its task's retries
STATUS_EVERY = 10.0  # seconds between status lines in the log
START_S = 300.0  # the workers' start (imports, a GPU context) before the driver gives up


def connect(address: str):
    """The ``ray`` module, connected: ``local`` starts Ray here with this machine's CPUs,
    ``auto`` joins the cluster ``ray start --head`` made, anything else is an address
    (``10.0.0.1:6379``, ``ray://head:10001``). Returns (ray, whether we started it)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'deploy-compiler[distributed]' "
                         "(ray>=2.9)") from None
    if ray.is_initialized():
        return ray, False
    try:
        if address == "local":
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                     logging_level="WARNING")  # a new instance, even beside `ray start`'s
        else:
            ray.init(address=address, logging_level="WARNING")
    except ConnectionError as e:
        raise UsageError(f"--ray {address}: no Ray cluster there ({e}); start one with `ray "
                         "start --head`, or use --ray local") from None
    return ray, True


CORES_DIR = "deploy-tune-cores"  # in the node's temporary folder: one lock file per core


def claim_cores(count: int) -> tuple[list[int] | None, list[int]]:
    """Pin this process to ``count`` cores that no other tuning worker on this node holds (of
    this run or another; a lock file per core, held while the returned descriptors are open,
    so a restarted worker finds its cores free). OpenMP in the measured kernels uses that many
    threads; compilers started from here inherit the cores. (None, []) when none are free."""
    cores = sorted(os.sched_getaffinity(0))
    folder = Path(tempfile.gettempdir()) / CORES_DIR
    folder.mkdir(exist_ok=True)
    for slot in range(len(cores) // count):
        mine = cores[slot * count:(slot + 1) * count]
        held = [fd for c in mine if (fd := _lock(folder / f"core{c}")) is not None]
        if len(held) == count:
            os.sched_setaffinity(0, mine)
            os.environ["OMP_NUM_THREADS"] = str(count)  # read when libgomp loads
            return mine, held
        for fd in held:
            os.close(fd)  # closing drops the lock
    return None, []


def _lock(path: Path) -> int | None:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


class Worker:
    """A measuring worker (a Ray actor): the job's measurer, made once; CPU jobs compile each
    batch here before timing it. Returns (times, busy seconds, pid) per batch."""

    def __init__(self, compile, measurer, pin_cores: int, merge=None):
        self.cores, self.locks = claim_cores(pin_cores) if pin_cores else (None, [])
        self.compile = compile  # None: the batches come compiled (GPU jobs) ...
        self.merge = merge  # ... in pieces, which this makes one
        self.measure = measurer()

    def hello(self) -> dict:
        import ray
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "cores": self.cores}

    def run(self, batch, *pieces) -> tuple[list[float], float, int]:
        """Time ``batch``: compiled here (CPU jobs), or from its compiled ``pieces`` (Ray
        passes each piece's result, an argument of its own)."""
        start = time.perf_counter()
        built = self.compile(batch) if self.compile is not None else self.merge(list(pieces))
        times = self.measure(batch, built)
        return list(times), time.perf_counter() - start, os.getpid()


def compile_task(compile, batch):
    """A compile pool task (GPU jobs): (what it built, busy seconds)."""
    start = time.perf_counter()
    built = compile(batch)
    return built, time.perf_counter() - start


@dataclass
class Flight:
    search: object
    batch: object
    worker: int | None  # None: a compile task
    built: list = field(default_factory=list)  # GPU jobs: the pieces' results (ObjectRefs)
    left: list = field(default_factory=lambda: [0])  # compile tasks: pieces still compiling,
    # shared by the batch's pieces (0: every piece in; -1: the kernel was dropped)


class RayDriver:
    """One tuning run on a connected Ray; ``run()`` returns the report."""

    def __init__(self, ray, job: TuningJob, db: TuningDB, budget_s: float, log,
                 workers: int | None, started: float):
        self.ray, self.job, self.db, self.log = ray, job, db, log
        self.budget_s, self.started = budget_s, started
        self.report = TuneReport(skipped=job.skipped)
        self.fresh, self.waiting, self.retry = deque(job.searches), deque(), deque()
        self.compiled: deque = deque()
        self.flights: dict = {}
        self.total, self.done = len(job.searches), 0
        self.n_workers = workers or self._default_workers()
        self._check_fits()
        self.compile_slots = 0 if job.compile_on_worker else self._compile_slots()

    # ---- sizing and starting ----------------------------------------------------------------

    def _default_workers(self) -> int:
        res = self.ray.cluster_resources()
        if self.job.device == "gpu":
            n = int(res.get("GPU", 0))
            if not n:
                raise UsageError("GPU tuning on Ray: the cluster has no GPU; start `ray start` "
                                 "on the GPU machines (it finds their GPUs)")
            return n
        return max(1, int(res.get("CPU", 1)) // max(1, self.job.pin_cores))

    def _check_fits(self) -> None:
        """Workers that the cluster cannot hold would wait for resources forever."""
        res = self.ray.cluster_resources()
        for key, have in (("num_cpus", res.get("CPU", 0)), ("num_gpus", res.get("GPU", 0))):
            need = self.n_workers * self.job.worker_options.get(key, 0)
            if need > have:
                raise UsageError(f"--workers {self.n_workers}: they need {need:g} "
                                 f"{key[4:].upper()}, the Ray cluster has {have:g}; use fewer "
                                 "workers (or --cores) or a larger cluster")

    def _compile_slots(self) -> int:
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        return max(1, cpus - self.n_workers * int(self.job.worker_options.get("num_cpus", 0)))

    def _start_workers(self) -> None:
        remote = self.ray.remote(Worker).options(
            max_restarts=RESTARTS, max_task_retries=RESTARTS, **self.job.worker_options)
        job = self.job
        compile = job.compile if job.compile_on_worker else None
        self.workers = [remote.remote(compile, job.measurer, job.pin_cores, job.merge)
                        for _ in range(self.n_workers)]
        self.alive = [True] * self.n_workers
        self.load = [0] * self.n_workers
        hello = [w.hello.remote() for w in self.workers]
        if not job.compile_on_worker:  # the pool compiles while the workers start
            self._compile = self.ray.remote(compile_task).options(
                num_cpus=1, num_returns=2, max_retries=RESTARTS)
            self._fill_compiles()
        try:
            hellos = self.ray.get(hello, timeout=START_S)
        except self.ray.exceptions.GetTimeoutError:
            raise DeployError(f"tuning on Ray: the workers did not start in {START_S:.0f} s "
                              "(`ray status` shows what the cluster has)") from None
        self.pids = [h["pid"] for h in hellos]
        self.report.workers, self.report.nodes = self.n_workers, len({h["node"] for h in hellos})
        self.report.compile_slots = self.compile_slots
        pinned = [h["cores"] for h in hellos]
        self.log(f"ray: {self.n_workers} workers on {self.report.nodes} node(s), pids "
                 f"{', '.join(map(str, self.pids))}"
                 + (f", cores {pinned}" if any(pinned) else "")
                 + (f"; {self.compile_slots} compile slots" if self.compile_slots else "")
                 + f"; {self.total} kernels to tune"
                 + (f" ({self.job.skipped} already in the database)" if self.job.skipped
                    else ""))

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> TuneReport:
        self.deadline = time.time() + self.budget_s
        self._start_workers()
        t0 = time.time()
        self.report.startup_s = t0 - self.started
        next_status = t0 + STATUS_EVERY
        try:
            while True:
                self._fill()
                if not self.flights:
                    break
                ready, _ = self.ray.wait(list(self.flights), num_returns=1,
                                         timeout=min(1.0, STATUS_EVERY))
                for ref in ready:
                    self._take(ref)
                if time.time() >= next_status:
                    self._status()
                    next_status = time.time() + STATUS_EVERY
        finally:
            for w in self.workers:
                self.ray.kill(w)
        self.report.wall_s = time.time() - t0
        tuning_step(self.log, self.done, self.total, self.report.gain(), self.deadline,
                    self.budget_s)
        return self.report

    def _next(self):
        """(search, batch) to submit next: a lost task first, then the next round of a search
        under way, then a new kernel; None when there is none (or the budget is spent)."""
        if self.retry:
            return self.retry.popleft()
        while self.waiting or self.fresh:
            if time.time() > self.deadline:
                self.report.stopped_by_budget = True
                while self.waiting:
                    self._finish(self.waiting.popleft())
                if self.fresh:
                    self.log(f"tune: budget spent with {len(self.fresh)} kernel(s) not started")
                    self.fresh.clear()
                return None
            search = self.waiting.popleft() if self.waiting else self.fresh.popleft()
            batch = search.next_batch()
            if batch is not None:
                return search, batch
            self._finish(search)
        return None

    def _fill(self) -> None:
        if self.job.compile_on_worker:
            while (w := self._free_worker()) is not None and (item := self._next()):
                self._submit_run(w, *item)
            return
        while self.compiled and (w := self._free_worker()) is not None:
            self._submit_run(w, *self.compiled.popleft())
        self._fill_compiles()

    def _fill_compiles(self) -> None:
        """GPU jobs: the next batches' compile tasks, while the pool has free slots and the
        compiled backlog is short."""
        backlog = DEPTH * sum(self.alive)
        while (self._compiling() < self.compile_slots and len(self.compiled) < backlog
               and (item := self._next())):
            search, batch = item
            pieces = self.job.split(batch)
            built, left = [], [len(pieces)]
            for piece in pieces:
                ref, busy = self._compile.remote(self.job.compile, piece)
                built.append(ref)
                self.flights[busy] = Flight(search, batch, None, built, left)

    def _free_worker(self) -> int | None:
        free = [w for w in range(self.n_workers) if self.alive[w] and self.load[w] < DEPTH]
        return min(free, key=self.load.__getitem__) if free else None

    def _compiling(self) -> int:
        return sum(1 for f in self.flights.values() if f.worker is None)

    def _submit_run(self, w: int, search, batch, built=()) -> None:
        ref = self.workers[w].run.remote(batch, *built)
        self.flights[ref] = Flight(search, batch, w, built)
        self.load[w] += 1

    def _take(self, ref) -> None:
        fl = self.flights.pop(ref)
        if fl.worker is None:  # a compile task (a piece of a batch) ended
            try:
                self.report.compile_busy_s += self.ray.get(ref)
            except self.ray.exceptions.RayError as e:
                if fl.left[0] > 0:  # the batch's first failed piece drops the kernel
                    fl.left[0] = -1
                    self._drop(fl, e)
                return
            if fl.left[0] > 0:
                fl.left[0] -= 1
                if fl.left[0] == 0:
                    self.compiled.append((fl.search, fl.batch, fl.built))
            return
        self.load[fl.worker] -= 1
        try:
            times, busy, pid = self.ray.get(ref)
        except self.ray.exceptions.RayActorError:  # out of restarts: another worker takes it
            if self.alive[fl.worker]:
                self.alive[fl.worker] = False
                self.log(f"ray: worker {fl.worker} (pid {self.pids[fl.worker]}) is gone")
            if not any(self.alive):
                raise DeployError("tuning on Ray: every worker died; the records so far are "
                                  f"in {self.db.path}, a rerun resumes from them") from None
            self.report.resubmitted += 1
            if self.job.compile_on_worker:
                self.retry.append((fl.search, fl.batch))
            else:  # measured again from what was compiled
                self.compiled.appendleft((fl.search, fl.batch, fl.built))
            return
        except self.ray.exceptions.RayError as e:
            return self._drop(fl, e)
        self.report.busy_s += busy
        if pid != self.pids[fl.worker]:
            self.report.restarts += 1
            self.log(f"ray: worker {fl.worker} restarted (pid {self.pids[fl.worker]} -> {pid}); "
                     "its task was measured again")
            self.pids[fl.worker] = pid
        fl.search.observe(times)
        self.waiting.append(fl.search)

    def _drop(self, fl: Flight, error) -> None:
        """A task that failed for good (its error, not a lost worker): the kernel keeps what
        it measured so far."""
        self.report.failed += 1
        self.log(f"tune: {fl.search.note[:60]}: a task failed, kernel dropped: "
                 f"{str(error).strip().splitlines()[-1][:200]}")
        self._finish(fl.search)

    def _finish(self, search) -> None:
        self.done += 1
        finish(search, self.db, self.report, self.log, self.done, self.total)
        tuning_step(self.log, self.done, self.total, self.report.gain(), self.deadline,
                    self.budget_s)

    def _status(self) -> None:
        r = self.report
        self.log(f"ray: {self.done}/{self.total} kernels, gain {r.gain():.2f}x so far (best "
                 f"kernel {r.best_kernel_gain:.2f}x), workers alive {sum(self.alive)}/"
                 f"{self.n_workers}, {len(self.flights)} tasks in flight, "
                 f"{time.time() - self.started:.0f} s")


def run_on_ray(job: TuningJob, address: str, db: TuningDB, budget_s: float, log=print,
               workers: int | None = None, reference: TuningDB | None = None) -> TuneReport:
    """Run ``job`` on Ray (``connect``'s ``address``); records merge into ``db``. With a
    ``reference`` database (a serial run's), the report counts the kernels that agree."""
    if not job.searches:
        log(f"tune: nothing to tune on Ray ({job.skipped} kernels already in the database)")
        return TuneReport(skipped=job.skipped)
    started = time.time()
    ray, own = connect(address)
    try:
        report = RayDriver(ray, job, db, budget_s, log, workers, started).run()
    finally:
        if own:
            ray.shutdown()
    if reference is not None:
        report.agreement = agreement(job.searches, reference)
    for line in describe(report, f"ray {address}"):
        log(line)
    return report
