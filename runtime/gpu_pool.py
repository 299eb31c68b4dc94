"""Device memory for the outputs a GPU module returns as ``DeviceArray``s, reused across runs.

One slab per run holds every output at its offset. It goes back to the pool when all of the
run's arrays, and every tensor a DLPack consumer made from them, are released; the next run
that takes it writes the same memory. Streams are ordered with events, never by the host
waiting: ``done`` is recorded after each run's output copies and a consumer's
``__dlpack__(stream=s)`` makes ``s`` wait for it; at the release, an event is recorded on each
consumer stream the slab was exported to, and the run that takes the slab next makes its own
stream wait for those first (the consumer's reads queued before the release finish before the
memory is overwritten). A device without events (host-memory test devices) needs none of this:
its runs complete before they return.
"""
from __future__ import annotations

import contextlib
import threading

POOL_KEEP = 4  # released slabs kept for reuse (more are freed)


class OutputPool:
    """The output slabs of one module (``nbytes`` each; see the module docstring). It outlives
    the module while arrays are alive (they refer to it); freed slabs are given back then."""

    def __init__(self, device, nbytes: int):
        self.device, self.nbytes = device, max(nbytes, 1)
        self.events = hasattr(device, "event")
        self.done = device.event() if self.events else None
        self._own = getattr(device, "stream_handle", None)
        self._free: list[Slab] = []
        self._lock = threading.Lock()
        self.made = 0  # slabs allocated so far (tests)

    def take(self, arrays: int) -> Slab:
        with self._lock:
            slab = self._free.pop() if self._free else None
        if slab is None:
            slab = Slab(self, self.device.alloc(self.nbytes, zero=False))
            self.made += 1
        for ev in slab.fences[:slab.armed]:
            self.device.wait_event(ev)  # consumers' reads of its last contents run first
        slab.armed, slab.live = 0, arrays
        return slab

    def written(self) -> None:
        """The run's output copies are queued: ``done`` completes after them."""
        if self.events:
            self.device.record(self.done)

    def query(self) -> bool:
        return self.device.query(self.done)

    def exported(self, slab: Slab, stream) -> None:
        """``__dlpack__(stream=...)`` of one of ``slab``'s arrays: the consumer's stream waits
        for the run (the latest ``done`` record, at or after the one of this slab's run)."""
        if not self.events:
            return  # a device without events synchronized the run
        handle = self.device.consumer_stream(stream)
        if handle is None or handle == self._own:
            return  # the consumer orders it itself, or it is our stream (in order already)
        self.device.activate()
        self.device.wait_event(self.done, handle)
        slab.streams.add(handle)

    def released(self, slab: Slab) -> None:
        with self._lock:
            slab.live -= 1
            if slab.live:
                return
        if slab.streams:
            self.device.activate()
            for k, handle in enumerate(slab.streams):
                if k == len(slab.fences):
                    slab.fences.append(self.device.event())
                self.device.record(slab.fences[k], handle)
            slab.armed = len(slab.streams)
            slab.streams.clear()
        with self._lock:
            if len(self._free) < POOL_KEEP:
                self._free.append(slab)
                return
        self._drop(slab)

    def _drop(self, slab: Slab) -> None:
        dev = self.device
        for ev in slab.fences[:slab.armed]:
            dev.event_sync(ev)
        dev.activate()
        if hasattr(dev, "free"):
            dev.free(slab.ptr)
        for ev in slab.fences:
            dev.destroy_event(ev)
        slab.fences = []

    def __del__(self):
        with contextlib.suppress(Exception):  # the driver may be gone at interpreter exit
            for slab in self._free:
                self._drop(slab)
            if self.done is not None:
                self.device.destroy_event(self.done)


class Slab:
    """One run's outputs: ``live`` arrays still refer to it; ``streams``: consumer streams of
    its current contents; ``fences[:armed]``: events recorded on them at the release."""

    __slots__ = ("armed", "fences", "live", "pool", "ptr", "streams")

    def __init__(self, pool: OutputPool, ptr: int):
        self.pool, self.ptr = pool, ptr
        self.live, self.armed, self.fences, self.streams = 0, 0, [], set()

    def exported(self, array, stream) -> None:
        self.pool.exported(self, stream)

    def released(self, array) -> None:
        self.pool.released(self)


__all__ = ["OutputPool", "Slab"]
