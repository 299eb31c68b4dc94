"""Does this CPU have the instruction sets an artifact was compiled for?

Code built for ``x86_64-avx512`` dies with SIGILL on a CPU without AVX-512; the runtime checks
the target's ``isa`` list against the features this CPU reports before it loads the library,
and refuses with a message naming what is missing. Only x86-64 on Linux is checked (elsewhere,
or for a cross-compiled artifact, the loader's own error stands)."""
from __future__ import annotations

import functools
import platform

# target-YAML spelling -> /proc/cpuinfo spelling, where they differ
CPUINFO_NAME = {"sse4.2": "sse4_2", "avx512bf16": "avx512_bf16", "avx512vnni": "avx512_vnni",
                "avxvnni": "avx_vnni", "amx-tile": "amx_tile", "amx-bf16": "amx_bf16",
                "amx-int8": "amx_int8"}


@functools.lru_cache(maxsize=1)
def host_flags() -> frozenset[str] | None:
    """This CPU's feature flags, or None where they cannot be read (not Linux x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def missing_features(target: dict, flags: frozenset[str] | None = None) -> list[str]:
    """The ``isa`` entries of an x86-64 ``target`` (a manifest's target dict) this CPU lacks."""
    flags = host_flags() if flags is None else flags
    if flags is None or not str(target.get("triple", "")).startswith("x86_64"):
        return []
    return [f for f in target.get("isa") or [] if CPUINFO_NAME.get(f, f) not in flags]
