"""A long-lived fuzz worker: imports deploy once, then runs the cases the parent sends.

``python -m deploy.tests.fuzz.worker SEEDS_DIR [MEMORY_GB]``: reads one JSON request a line on stdin
(``{"family", "seed", "index"}``) and answers one JSON line on its original stdout (``{"label",
"outcome", "detail", "seconds"}``); anything else printed goes to stderr, the worker's log, as
does faulthandler's stack when the process dies of a signal. The parent kills a worker that
runs past the per-case timeout and replaces one that dies (``pool.py``)."""
from __future__ import annotations

import collections
import faulthandler
import hashlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path

import numpy as np

from .judge import Result, crashed
from .seeds import Seeds


def families() -> dict:
    from . import fam_artifacts, fam_onnx_bytes, fam_onnx_structure, fam_runtime, fam_yaml
    return {"onnx-bytes": fam_onnx_bytes.case, "onnx-structure": fam_onnx_structure.case,
            "target-yaml": fam_yaml.case, "artifacts": fam_artifacts.case,
            "runtime-inputs": fam_runtime.case}


FAMILIES = ("onnx-bytes", "onnx-structure", "target-yaml", "artifacts", "runtime-inputs")
ALL = (*FAMILIES, "selftest")


def selftest(index: int) -> tuple[str, Result]:
    """The harness's own check (family ``selftest``, never in a default run): case 0 dies of
    SIGSEGV, case 1 hangs, case 2 raises a raw exception, others end in a DeployError."""
    import ctypes

    from deploy.errors import InputError

    from .judge import judge
    if index == 0:
        ctypes.string_at(0)  # a segfault
    elif index == 1:
        time.sleep(3600)
    elif index == 2:
        return "raise", judge(lambda: {}["missing"])

    def refuse():
        raise InputError("a one-line message")
    return "error", judge(refuse)


def case_rng(seed: int, family: str, index: int) -> np.random.Generator:
    """A case is named by (seed, family, index) alone, whatever else the run selects."""
    return np.random.default_rng([seed, zlib.crc32(family.encode()), index])


def run_case(family: str, seed: int, index: int, seeds: Seeds) -> dict:
    """One case in this process: its label, outcome, detail and seconds."""
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f"case-{index}-"))
    label = "?"
    try:
        if family == "selftest":
            label, result = selftest(index)
        else:
            label, result = families()[family](case_rng(seed, family, index), seeds, tmp)
    except (Exception, RecursionError) as e:  # noqa: BLE001  (escaped the case's own judge)
        result = crashed(e)
        result.detail = "(outside the case's checks) " + result.detail
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"label": label, **result.as_json(), "seconds": round(time.perf_counter() - start, 3)}


def memoize_builds(keep: int = 64) -> None:
    """The C backend's library builds, remembered by their sources and flags: fuzzed weights
    change no generated code, so most compiles reuse a library (the compiler is deterministic
    on its input). Builds run one compiler process at a time (the machine is shared)."""
    from deploy.backends.c import backend
    real = backend.build_shared_library
    memo: collections.OrderedDict[str, bytes] = collections.OrderedDict()

    def build(sources, out_path, flags=(), jobs=None):
        key = hashlib.sha256(repr((list(sources), tuple(flags))).encode()).hexdigest()
        if key in memo:
            memo.move_to_end(key)
            Path(out_path).write_bytes(memo[key])
            return Path(out_path)
        path = real(sources, out_path, flags, 1)
        memo[key] = Path(path).read_bytes()
        if len(memo) > keep:
            memo.popitem(last=False)
        return path

    backend.build_shared_library = build


def quiet() -> None:
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")


def limit_memory(gb: float) -> None:
    """At most ``gb`` of address space (an allocation past it is a MemoryError, not the
    machine's memory), no core files."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    limit = int(gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        limit_memory(float(argv[1]))
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (a C library's, ORT's) go to the log, not the protocol
    faulthandler.enable(sys.stderr)
    quiet()
    memoize_builds()
    seeds = Seeds(Path(argv[0]))
    families()  # import every family before saying ready
    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        print(f"case {req['family']}#{req['index']}", file=sys.stderr, flush=True)
        answers.write(json.dumps(run_case(req["family"], req["seed"], req["index"], seeds))
                      + "\n")
    return 0


__all__ = ["FAMILIES", "Result", "main", "run_case"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
