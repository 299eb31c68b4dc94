"""Reports of a conformance run (see tests/conformance.py): the markdown page, the per-case
JSON, and the expected-failure list the CI fast tier reads."""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
from collections import Counter, defaultdict

from .conformance import BACKENDS, KINDS, STATUSES, Case, Result

TOP = 30  # rows in the "top ..." tables


def _versions() -> dict:
    import onnx
    import onnxruntime
    return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version()}


def pass_counts(results: list[Result], backend: str) -> dict[str, int]:
    """Passing cases per kind, plus 'total'."""
    counts = {k: 0 for k in KINDS}
    for r in results:
        if r.backend == backend and r.status == "pass":
            counts[r.kind] += 1
    counts["total"] = sum(counts.values())
    return counts


# ----------------------------------------------------------------------------- JSON

def write_json(path: str, results: list[Result], command: str, wall: float) -> None:
    """Per-case outcomes, one case per line (small diffs): ``{"kind": ..., "deploy": status or
    [status, detail], "ort": ...}``; details are trimmed, the statuses are exact."""
    by_case: dict[str, dict] = defaultdict(dict)
    rank = {b: i for i, b in enumerate(BACKENDS)}
    for r in sorted(results, key=lambda r: (r.case, rank.get(r.backend, 9))):
        by_case[r.case]["kind"] = r.kind
        by_case[r.case][r.backend] = r.status if r.status == "pass" else [r.status, r.detail[:140]]
    head = {"date": datetime.date.today().isoformat(), "command": command,
            "wall_seconds": round(wall), **_versions(),
            "totals": {b: pass_counts(results, b) for b in sorted({r.backend for r in results})}}
    lines = [json.dumps(head)[:-1] + ', "cases": {']
    items = [f"{json.dumps(name)}: {json.dumps(v)}" for name, v in by_case.items()]
    lines.append(",\n".join(items))
    lines.append("}}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- xfail list

XFAIL_HEADER = """\
# ONNX backend-test cases that deploy fails today: name, then the reason.
# The CI fast tier (tests/test_conformance.py) marks the ones it runs as strict xfail,
# so a case that starts passing fails the tier until it is removed here.
# Drop the cases that pass now (after adding ops):
#   python -m deploy.tests.conformance --fast --no-ort --prune-xfail
# Regenerate from a full run:
#   python -m deploy.tests.conformance --full --no-ort --write-xfail tests/conformance_xfail.txt
"""

def write_xfail(path: str, results: list[Result]) -> None:
    """deploy's failing cases, one ``name  status: reason`` per line, sorted by name."""
    rows = sorted((r.case, _reason(r)) for r in results
                  if r.backend == "deploy" and r.status != "pass")
    width = max((len(n) for n, _ in rows), default=0)
    with open(path, "w") as f:
        f.write(XFAIL_HEADER)
        f.writelines(f"{name.ljust(width)}  {reason}\n" for name, reason in rows)


def _reason(r: Result) -> str:
    if r.status == "unsupported-op":
        return f"unsupported-op: {', '.join(r.missing)}"
    detail = re.sub(r"\s+", " ", r.detail)[:110]
    return f"{r.status}: {detail}"


def prune_xfail(path: str, results: list[Result]) -> list[str]:
    """Drop from the xfail list the cases deploy passed in ``results`` (any subset run);
    returns their names."""
    passed = {r.case for r in results if r.backend == "deploy" and r.status == "pass"}
    removed = sorted(passed & set(read_xfail(path)))
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    with open(path, "w") as f:
        f.writelines(ln for ln in lines if ln.split(" ")[0].strip() not in removed)
    return removed


def read_xfail(path: str) -> dict[str, str]:
    """name -> reason, from an xfail list (blank lines and ``#`` comments ignored)."""
    out: dict[str, str] = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            out[name] = reason.strip() or "expected failure"
    return out


# ----------------------------------------------------------------------------- markdown

def write_report(path: str, cases: list[Case], results: list[Result], command: str,
                 wall: float, jobs: int | None = None) -> None:
    """The markdown page: pass counts per kind (deploy and ORT), failure classes, the op
    types behind the failures, the most frequent error messages, and how to reproduce."""
    parts = [_header(command, wall, jobs), _counts_table(cases, results),
             _classes_table(results), _ort_versions(results), _unsupported_table(results),
             _failing_ops_table(results), _messages_table(results), _howto()]
    with open(path, "w") as f:
        f.write("\n\n".join(p for p in parts if p) + "\n")


def _header(command: str, wall: float, jobs: int | None) -> str:
    v = _versions()
    return (f"# ONNX conformance\n\n"
            f"The backend-test cases shipped with the installed `onnx` package, run through "
            f"`deploy.onnx_backend` (CPU, target `host`) and, by the same runner in the same run, "
            f"through ONNX Runtime's `InferenceSession` (CPU provider). Each case runs in its own "
            f"process with a timeout; outputs are compared with the case's rtol/atol as onnx's "
            f"own runner does.\n\n"
            f"- date: {datetime.date.today().isoformat()}\n"
            f"- command: `{command}`\n"
            f"- onnx {v['onnx']}, onnxruntime {v['onnxruntime']}, Python {v['python']}, "
            f"{os.cpu_count()} CPU cores, {jobs or os.cpu_count()} case processes; "
            f"wall time {wall / 60:.1f} min\n"
            f"- per-case results: [conformance.json](conformance.json); known failures: "
            f"`tests/conformance_xfail.txt`")


def _counts_table(cases: list[Case], results: list[Result]) -> str:
    n = Counter(c.kind for c in cases)
    dep, ort = pass_counts(results, "deploy"), pass_counts(results, "ort")
    has_ort = any(r.backend == "ort" for r in results)
    rows = ["| kind | cases | deploy passes | ONNX Runtime passes |", "|---|---:|---:|---:|"]
    for k in (*KINDS, "total"):
        total = len(cases) if k == "total" else n[k]
        bold = "**" if k == "total" else ""
        rows.append(f"| {bold}{k}{bold} | {total} | {bold}{_share(dep[k], total)}{bold} | "
                    f"{_share(ort[k], total) if has_ort else 'not run'} |")
    return "## Pass counts\n\n" + "\n".join(rows)


def _share(passed: int, total: int) -> str:
    return f"{passed} ({100 * passed / total:.1f}%)" if total else "0"


def _classes_table(results: list[Result]) -> str:
    counts = {b: Counter(r.status for r in results if r.backend == b) for b in BACKENDS}
    rows = ["| outcome | deploy | ONNX Runtime |", "|---|---:|---:|"]
    rows += [f"| {s} | {counts['deploy'][s]} | {counts['ort'][s]} |" for s in STATUSES
             if counts["deploy"][s] or counts["ort"][s]]
    legend = ("unsupported-op: an op has no converter (or a converter rejects its attributes); "
              "ir/opset-version: the model's IR or opset version is newer than the backend reads; "
              "compile-error: import, passes, lowering or the C compiler failed (ORT: session "
              "creation failed); runtime-error: running raised; shape/dtype-mismatch and "
              "numeric-mismatch: outputs differ from the expected ones; timeout: no result in "
              "time; crash: the case process died (segfault, abort).")
    return "## Outcomes\n\n" + "\n".join(rows) + "\n\n" + legend


def _ort_versions(results: list[Result]) -> str:
    ort = sorted(r.case for r in results if r.backend == "ort" and r.status == "ir/opset-version")
    binding = sum(r.backend == "ort" and "MLDataType" in r.detail for r in results)
    if not ort and not binding:
        return ""
    text = (f"## ONNX Runtime failures from IR / opset versions\n\n{len(ort)} cases are "
            f"stamped with an IR version newer than this ONNX Runtime reads, an opset it calls "
            f"\"under development\", or (the opset < 7 PyTorch exports) op versions it has no "
            f"kernels for:\n" + ", ".join(f"`{n}`" for n in ort))
    if binding:
        text += (f"\n\nAnother {binding} ORT runtime-errors come from its Python binding, which "
                 f"cannot take numpy arrays of the float8/float4/int4/int2 dtypes "
                 f"(`Numpy_type N can't be converted to MLDataType`), not from wrong results.")
    return text


def _unsupported_table(results: list[Result]) -> str:
    blocked = Counter(op for r in results if r.backend == "deploy" for op in r.missing)
    if not blocked:
        return ""
    rows = ["| op type | cases it blocks |", "|---|---:|"]
    rows += [f"| {op} | {n} |" for op, n in blocked.most_common(TOP)]
    more = f"\n\n{len(blocked) - TOP} more op types are listed in conformance.json." \
        if len(blocked) > TOP else ""
    return (f"## Unsupported op types (deploy)\n\n{len(blocked)} op types have no converter; "
            f"the {min(TOP, len(blocked))} that block the most cases:\n\n" + "\n".join(rows) + more)


def _failing_ops_table(results: list[Result]) -> str:
    dep = [r for r in results if r.backend == "deploy" and r.kind == "node"]
    op_of = primary_ops(dep)
    total, failing = Counter(), defaultdict(Counter)
    for r in dep:
        total[op_of[r.case]] += 1
        if r.status != "pass":
            failing[op_of[r.case]][r.status] += 1
    order = sorted(failing, key=lambda op: (-sum(failing[op].values()), op))[:TOP]
    rows = ["| op type | failing node cases | of | outcomes |", "|---|---:|---:|---|"]
    for op in order:
        outs = ", ".join(f"{s} {n}" for s, n in failing[op].most_common())
        rows.append(f"| {op} | {sum(failing[op].values())} | {total[op]} | {outs} |")
    return ("## Top failing op types (deploy, node cases)\n\nA node case is counted under the "
            "op it tests (its single node, or for `_expanded` cases the op of the unexpanded "
            "twin).\n\n" + "\n".join(rows))


def primary_ops(results: list[Result]) -> dict[str, str]:
    """Case name -> the op type a node case tests."""
    core = {r.case: [op for op in r.ops if op != "Constant"] or r.ops for r in results}
    single = {name: ops[0] for name, ops in core.items() if len(ops) == 1}
    out = {}
    for r in results:
        twin = re.sub(r"_expanded.*$", "", r.case)
        out[r.case] = single.get(r.case) or single.get(twin) or "+".join(core[r.case][:3]) or "?"
    return out


def _messages_table(results: list[Result]) -> str:
    """The most frequent compile/run error messages (numbers and names blurred)."""
    sig = Counter()
    for r in results:
        if r.backend == "deploy" and r.status in ("compile-error", "runtime-error", "crash"):
            sig[(r.status, _signature(r.detail))] += 1
    if not sig:
        return ""
    rows = ["| outcome | cases | message (first line, numbers and quoted names blurred) |",
            "|---|---:|---|"]
    rows += [f"| {s} | {n} | `{m}` |" for (s, m), n in sig.most_common(20)]
    return "## Most frequent errors (deploy)\n\n" + "\n".join(rows)


def _signature(detail: str) -> str:
    text = detail.split(" | ")[0]
    text = re.sub(r"'[^']*'|\"[^\"]*\"|%\S+", "'…'", text)
    text = re.sub(r"\d+", "N", text)
    return text[:110].replace("|", "/").replace("`", "'")


def _howto() -> str:
    return ("## Running it\n\n"
            "```\n"
            "python -m deploy.tests.conformance --full --report docs/conformance.md  # this page\n"
            "python -m deploy.tests.conformance --kind node --match relu            # some cases\n"
            "python -m deploy.tests.conformance --cases test_relu --no-ort          # one case\n"
            "python -m pytest -q tests/test_conformance.py                          # CI fast tier\n"
            "python -m deploy.tests.conformance --full --no-ort "
            "--write-xfail tests/conformance_xfail.txt\n"
            "python -m deploy.tests.conformance --fast --no-ort --prune-xfail     "
            "# drop fixed cases\n"
            "```\n\n"
            "See `tests/conformance.py` for the options (jobs, timeouts, sampling).")
