"""Environment knobs, all in one place (documented in docs/debugging.md).

DEPLOY_DEBUG=0..4   0 quiet; 1 run the verifier after every pass; 2 also show tracebacks for
                    user errors; 3 keep build directories; 4 print generated C per kernel.
DEPLOY_DUMP_DIR     default for --dump-dir.
DEPLOY_CACHE_DIR    where compiled libraries are cached (default ~/.cache/deploy).
DEPLOY_DISABLE_PASSES  comma-separated pass names to skip (e.g. "fuse" for the op-by-op
                    compiler, to compare against).
DEPLOY_TUNING_DB    the tuning database used when --tuning-db is not given
                    (default ~/.cache/deploy/tuning.jsonl).
"""
from __future__ import annotations

import os


def debug_level() -> int:
    try:
        return int(os.environ.get("DEPLOY_DEBUG", "0"))
    except ValueError:
        return 0


def dump_dir() -> str | None:
    return os.environ.get("DEPLOY_DUMP_DIR") or None


def tuning_db_path() -> str:
    return os.environ.get("DEPLOY_TUNING_DB") or os.path.join(
        os.path.expanduser("~"), ".cache", "deploy", "tuning.jsonl")


def disabled_passes() -> set[str]:
    return {p.strip() for p in os.environ.get("DEPLOY_DISABLE_PASSES", "").split(",") if p.strip()}
