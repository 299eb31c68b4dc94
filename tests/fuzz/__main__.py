"""``python -m deploy.tests.fuzz --cases 10000 --seed 0 --jobs 2 [--family F ...] [--json OUT]``

Prints one table row per family (cases, errors as expected, correct results, crashes, hangs,
silent acceptances, bad messages) and every failing case. ``--replay FAMILY#INDEX`` reruns one
case in this process (same ``--seed``) and prints its outcome with the traceback."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from .pool import run_fuzz
from .worker import ALL


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.tests.fuzz", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--cases", type=int, default=500, help="cases in all (default 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--family", action="append", choices=ALL,
                   help="only these families (repeatable; default all)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case (a hang)")
    p.add_argument("--memory-gb", type=float, default=4.0, help="address space per worker")
    p.add_argument("--json", help="write counts per family and label, and every failure")
    p.add_argument("--replay", metavar="FAMILY#INDEX", help="run one case here and print it")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    args = p.parse_args(argv)
    if args.replay:
        return replay(args.replay, args.seed)

    def progress(r, done, total):
        if r.outcome in ("crash", "hang", "silent", "bad-message"):
            print(f"\n{r.id} [{r.label}] {r.outcome}: {r.detail[:300]}", file=sys.stderr)
        if not args.quiet and (done % 50 == 0 or done == total):
            print(f"\r{done}/{total} cases", end="" if done < total else "\n", file=sys.stderr,
                  flush=True)

    report = run_fuzz(args.cases, args.seed, args.jobs, args.family, args.timeout,
                      memory_gb=args.memory_gb, progress=progress)
    print(f"python -m deploy.tests.fuzz --cases {args.cases} --seed {args.seed} "
          f"--jobs {args.jobs}: {report.wall:.0f} s wall")
    print(report.table())
    for r in report.failures():
        print(f"- {r.id} [{r.label}] {r.outcome}: {r.detail.splitlines()[0][:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json(), indent=1))
    return 1 if report.failures() else 0


def replay(case_id: str, seed: int) -> int:
    from .seeds import Seeds, prepare
    from .worker import memoize_builds, quiet, run_case
    family, _, index = case_id.partition("#")
    quiet()
    memoize_builds()
    folder = prepare(Path(tempfile.mkdtemp(prefix="deploy-fuzz-replay-")))
    result = run_case(family, seed, int(index), Seeds(folder))
    print(f"{case_id} [{result['label']}] {result['outcome']} ({result['seconds']} s)")
    print(result["detail"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
