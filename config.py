"""Environment knobs, all in one place (documented in docs/debugging.md).

DEPLOY_DEBUG=0..4   0 quiet; 1 run the verifier after every pass; 2 also show tracebacks for
                    user errors; 3 keep build directories; 4 print generated C per kernel.
DEPLOY_DUMP_DIR     default for --dump-dir.
DEPLOY_CACHE_DIR    where compiled libraries are cached (default ~/.cache/deploy).
DEPLOY_DISABLE_PASSES  comma-separated pass names to skip (e.g. "fuse" for the op-by-op
                    compiler, to compare against).
DEPLOY_TUNING_DB    the tuning database used when --tuning-db is not given
                    (default ~/.cache/deploy/tuning.jsonl).
DEPLOY_GPU_LINEINFO=1  Triton binaries keep line information (source lines in a profiler;
                    3x larger cubins, 5-7% longer compiles, the same machine code).

Also the helpers every cache file is written with: ``atomic_write`` and ``file_lock``.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def debug_level() -> int:
    try:
        return int(os.environ.get("DEPLOY_DEBUG", "0"))
    except ValueError:
        return 0


def dump_dir() -> str | None:
    return os.environ.get("DEPLOY_DUMP_DIR") or None


def cache_dir() -> Path:
    """The root of deploy's caches: $DEPLOY_CACHE_DIR, else ~/.cache/deploy."""
    return Path(os.environ.get("DEPLOY_CACHE_DIR") or
                os.path.join(os.path.expanduser("~"), ".cache", "deploy"))


def tuning_db_path() -> str:
    return os.environ.get("DEPLOY_TUNING_DB") or os.path.join(
        os.path.expanduser("~"), ".cache", "deploy", "tuning.jsonl")


def gpu_line_info() -> bool:
    """Whether Triton binaries keep line information (``DEPLOY_GPU_LINEINFO=1``)."""
    return os.environ.get("DEPLOY_GPU_LINEINFO", "0") not in ("", "0")


def disabled_passes() -> set[str]:
    return {p.strip() for p in os.environ.get("DEPLOY_DISABLE_PASSES", "").split(",") if p.strip()}


# ---- cache files shared between processes ------------------------------------------------------
# Every cache file (the tuning database, compiled-module caches) is replaced whole, never
# written in place: a reader sees the old file or the new one, and an interrupted writer
# (Ctrl-C, a crash) leaves the old one. Writers that merge (read, combine, write) hold the
# file's lock for the whole read-modify-write so that concurrent ones do not lose each other's
# records. docs/reliability.md.

def atomic_write(path: str | os.PathLike, data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``
    (``durable``: fsync first, so a power loss cannot leave an empty file either)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no temporary file left behind
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (``fcntl.flock`` on the sidecar ``path.lock``, made
    if missing) for the block; waits while another process or thread holds it. The lock goes
    with the process, so a killed writer never leaves a stale one."""
    lock = Path(f"{path}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)
