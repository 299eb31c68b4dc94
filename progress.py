"""Progress of long commands (compile, tune, bench): events, and the reporters that show them.

The compiler and the backends never print progress: they report to the ``Progress`` object they
are given (``deploy.compile(..., progress=...)``), and the command line chooses which one:

    =====================  ============================================================
    ``Progress()``         drops every event: the Python API's default (silent)
    ``Callback(fn)``       calls ``fn(event)``: ``deploy.compile(m, progress=print)``
    ``TerminalProgress``   one live status line on a terminal (tqdm): stage, kernels N/total
    ``JsonLines``          one JSON object per line (``--log-json``)
    =====================  ============================================================

What is reported, in order: a ``start`` and an ``end`` event per stage (``import``,
``optimize``, ``lower``, ``tune``, ``render+build``, ``package``, ``check``; the ``end``
carries the stage's seconds), and between them ``progress`` events of counted steps: kernels
rendered (``render``) and built (``build``), kernels tuned (``tune``, with the best gain so far
and the seconds left of the budget); ``log`` events carry the tuner's lines.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import UsageError


@dataclass(frozen=True)
class Event:
    """One thing that happened.

    ``event``: ``start`` / ``end`` (of a stage), ``progress`` (``done`` of ``total`` in a
    counted ``step`` of the stage) or ``log`` (a line, in ``info["message"]``). ``seconds``:
    the stage's duration (``end``) or the time spent in the step so far (``progress``).
    ``info``: what else the step knows (``unit``, tuning's ``gain`` and ``left_s``)."""
    event: str
    stage: str
    step: str | None = None
    done: int | None = None
    total: int | None = None
    seconds: float | None = None
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The ``--log-json`` line's object: the fields that are set, then ``info``'s."""
        out = {"event": self.event, "stage": self.stage}
        for key in ("step", "done", "total", "seconds"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, 4) if isinstance(value, float) else value
        out.update(self.info)
        return out


class Progress:
    """Receives a run's progress; this base class drops every event (the API's default).

    Subclasses override ``event``. The producers call ``begin`` / ``end`` around a stage,
    ``count`` in a counted step and ``log`` for a line of text."""

    def __init__(self) -> None:
        self.stage = ""
        self._step_start: dict[str, float] = {}

    def event(self, ev: Event) -> None:
        """Show or record one event (the only method a reporter must override)."""

    def begin(self, stage: str) -> None:
        self.stage = stage
        self._step_start.clear()
        self.event(Event("start", stage))

    def end(self, stage: str, seconds: float) -> None:
        self.event(Event("end", stage, seconds=seconds))

    def count(self, step: str, done: int, total: int, **info) -> None:
        """``done`` of ``total`` (kernels, unless ``unit`` says otherwise) in ``step``."""
        start = self._step_start.setdefault(step, time.perf_counter())
        self.event(Event("progress", self.stage, step, done, total,
                         time.perf_counter() - start, {"unit": "kernels", **info}))

    def log(self, message: str) -> None:
        self.event(Event("log", self.stage, info={"message": message}))

    def echo(self, write: Callable[[str], object], text: str) -> None:
        """Call ``write(text)`` (a print to stdout) with the display out of its way."""
        write(text)

    def tuner_log(self, echo: Callable[[str], object] | None = None) -> TunerLog:
        """The ``log`` a tuner is given: lines become ``log`` events (and go to ``echo``)."""
        return TunerLog(self, echo)

    def close(self) -> None:
        """Take the display down (a terminal's status line)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Callback(Progress):
    """Every event to ``fn`` (``deploy.compile(model, progress=events.append)``)."""

    def __init__(self, fn: Callable[[Event], object]) -> None:
        super().__init__()
        self.fn = fn

    def event(self, ev: Event) -> None:
        self.fn(ev)


class TunerLog:
    """What the compiler passes a tuner as its ``log``: called with a line, and told how far
    tuning is through ``step`` (``tuning_step`` below; plain callables only get lines)."""

    def __init__(self, progress: Progress, echo: Callable[[str], object] | None) -> None:
        self.progress, self.echo = progress, echo

    def __call__(self, line: str) -> None:
        self.progress.log(line)
        if self.echo is not None:
            self.progress.echo(self.echo, line)

    def step(self, done: int, total: int, gain: float, left_s: float, budget_s: float) -> None:
        self.progress.count("tune", done, total, gain=round(gain, 3), left_s=round(left_s, 1),
                            budget_s=round(budget_s, 1))


def tuning_step(log, done: int, total: int, gain: float, deadline: float,
                budget_s: float) -> None:
    """A tuning loop's progress hook: kernels ``done`` of ``total``, the gain so far and the
    budget left (``deadline`` on ``time.time()``'s clock), when ``log`` takes it."""
    step = getattr(log, "step", None)
    if step is not None:
        step(done, total, gain, max(0.0, deadline - time.time()), budget_s)


def as_progress(value) -> Progress:
    """``deploy.compile``'s ``progress=``: None (silent), a ``Progress``, or a callable that
    takes each ``Event``."""
    if value is None:
        return Progress()
    if isinstance(value, Progress):
        return value
    if callable(value):
        return Callback(value)
    raise UsageError(f"progress={value!r}: expected a deploy.progress.Progress, a function "
                     "taking each Event, or None")


# ---- reporters for the command line ---------------------------------------------------------

class JsonLines(Progress):
    """One JSON object per line on ``stream`` (stderr), with ``elapsed`` seconds since the
    start. Progress events of a step are thinned to one per ``interval`` seconds (its first and
    last always come)."""

    def __init__(self, stream=None, interval: float = 0.25) -> None:
        super().__init__()
        self.stream = stream or sys.stderr
        self.interval = interval
        self._t0 = time.perf_counter()
        self._last: dict[tuple, float] = {}

    def event(self, ev: Event) -> None:
        now = time.perf_counter()
        if ev.event == "progress":
            key = (ev.stage, ev.step)
            if 0 < ev.done < ev.total and now - self._last.get(key, now - 1e9) < self.interval:
                return
            self._last[key] = now
        line = dict(ev.to_json(), elapsed=round(now - self._t0, 3))
        self.stream.write(json.dumps(line) + "\n")
        self.stream.flush()


class TerminalProgress(Progress):
    """One live status line on a terminal (``tqdm``), redrawn in place and erased when done:

        import [00:03]
        render: 57/124 kernels |█████▌      | [00:02<00:02]
        tune: 3/12 kernels |███         | [01:19, gain 1.12x, 8:41 left of 10:00]

    A stage without counts shows its elapsed time, redrawn by a ticker thread; ``tick=False``
    leaves it out where a sleeping thread would show in the figures (a Python thread, even
    asleep, adds ~30 us to each call of a small model: ``deploy bench``), and tqdm's own
    monitor thread is never started."""

    TICK = 0.5  # seconds between redraws of a line that nothing updates

    def __init__(self, stream=None, prefix: str = "", tick: bool = True) -> None:
        super().__init__()
        self.stream = stream or sys.stderr
        self.prefix = prefix
        self.tick = tick
        self._bar = None
        self._step = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def event(self, ev: Event) -> None:
        with self._lock:
            if ev.event == "start":
                self._open(ev.stage, None)
            elif ev.event == "end":
                self._close_bar()
            elif ev.event == "progress":
                self._progress(ev)

    def _progress(self, ev: Event) -> None:
        if self._bar is None or self._step != ev.step or self._bar.total != ev.total:
            self._open(ev.step, ev.total, ev.info.get("unit", ""))
        if ev.step == "tune" and "left_s" in ev.info:
            self._bar.set_postfix_str(f"gain {ev.info['gain']:.2f}x, "
                                      f"{_clock(ev.info['left_s'])} left of "
                                      f"{_clock(ev.info['budget_s'])}", refresh=False)
        self._bar.update(max(0, ev.done - self._bar.n))
        if ev.done >= ev.total:  # the last count is drawn even within tqdm's mininterval
            self._bar.refresh()

    def _open(self, what: str, total: int | None, unit: str = "") -> None:
        self._close_bar()
        desc = f"{self.prefix}{what}"
        cols, rows = _size(self.stream)
        if total is None:
            fmt = "{desc} [{elapsed}]"
        elif what == "tune":
            fmt = "{desc}: {n_fmt}/{total_fmt} " + unit + " |{bar:12}| [{elapsed}{postfix}]"
        else:
            fmt = "{desc}: {n_fmt}/{total_fmt} " + unit + " |{bar:20}| [{elapsed}<{remaining}]"
        self._bar = _bar_class()(total=total, desc=desc, bar_format=fmt, file=self.stream, leave=False,
                         ncols=cols, nrows=rows, mininterval=0.1, smoothing=0.1)
        self._step = what
        self._start_ticker()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar, self._step = None, None

    def _start_ticker(self) -> None:
        if self.tick and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="deploy-progress",
                                            daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()

    def echo(self, write: Callable[[str], object], text: str) -> None:
        from tqdm import tqdm
        with self._lock, tqdm.external_write_mode(file=self.stream):
            write(text)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            self._close_bar()


def _bar_class():
    """tqdm's bar without its monitor thread (only a terminal pays for the import)."""
    from tqdm import tqdm

    class Bar(tqdm):
        monitor_interval = 0

    return Bar


def _size(stream) -> tuple[int, int]:
    """The terminal's columns and lines (read per bar: a resize shows at the next one); 80 x 24
    where it tells none (a pseudo-terminal without a size: tqdm would draw nothing)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return 80, 24
    return size.columns or 80, size.lines or 24


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}" if m < 60 else f"{m // 60}:{m % 60:02d}:{s:02d}"


def is_terminal(stream) -> bool:
    """A stream a status line can be redrawn on: a TTY, and TERM is not ``dumb``."""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def for_command(quiet: bool = False, log_json: bool = False, stream=None,
                tick: bool = True) -> Progress:
    """The command line's reporter: ``--log-json`` lines, else a status line when ``stream``
    (stderr) is a terminal and ``--quiet`` is not given (``tick``: see TerminalProgress), else
    nothing."""
    stream = stream or sys.stderr
    if log_json:
        return JsonLines(stream)
    if quiet or not is_terminal(stream):
        return Progress()
    return TerminalProgress(stream, tick=tick)
