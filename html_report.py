"""``deploy inspect ARTIFACT --html out.html``: the fused graph as one self-contained page.

The page draws the plan in step order, top to bottom: one box per step (a kernel, a host op or a
view) with its op, note, template, the bytes of the values it writes and, when known, its time;
lines join each step to the steps that read its outputs (value ids of the manifest's ``steps``).
A table below lists the kernels, sortable by any column. Everything is inline (SVG, CSS and a
few lines of JavaScript): the file opens offline.

Times come from ``--profile F.json`` (what ``python -m deploy.bench.gpu_profile ART --json F``
writes on the GPU: per launch, its kernel symbol and milliseconds) or, for CPU artifacts with
fixed sizes, from timing each kernel here (``bench/cpu_profile.py``); otherwise the page says why
there are none. Reads the artifact with the runtime only (no compiler).
"""
from __future__ import annotations

import json
from html import escape
from pathlib import Path

import numpy as np

from .errors import UsageError
from .runtime.shapes import dim_text

BOX_W, KERNEL_H, VIEW_H, GAP, LEFT, LANE, VIEW_INDENT = 640, 58, 26, 16, 250, 7, 40
KIND_COLOR = {"kernel": "#3b6fb6", "host": "#c46a1b", "view": "#8a8a8a", "io": "#3a8a4a"}


# ---- times ------------------------------------------------------------------------------------

def kernel_times(path: str, manifest: dict, profile: str | None = None,
                 runs: int = 3) -> tuple[dict[str, float], str]:
    """Kernel symbol -> milliseconds, and where they come from (or why there are none)."""
    if profile:
        return _profile_times(profile, path), (
            f"GPU times from {Path(profile).name} (python -m deploy.bench.gpu_profile): "
            "each launch alone between CUDA events, summed per kernel")
    if "gpu" in manifest:
        return {}, ("no times: a GPU artifact is timed on its GPU; run `python -m "
                    "deploy.bench.gpu_profile ARTIFACT --json F.json` there and pass "
                    "--profile F.json")
    if runs <= 0:
        return {}, "no times (--runs 0)"
    if manifest.get("symbols"):
        return {}, ("no times: the artifact has symbolic sizes and bench/cpu_profile.py times "
                    "fixed-size artifacts (compile with --shape to time kernels here)")
    from .bench.cpu_profile import profile as cpu_profile
    try:
        rows = cpu_profile(path, runs)
    except Exception as e:  # noqa: BLE001  (a diagnostic: the page is drawn without times)
        return {}, f"no times: timing the kernels here failed ({type(e).__name__}: {e})"
    return ({step["symbol"]: ms for ms, step, _ in rows},
            (f"CPU times measured here: each kernel called alone, median of {runs} calls "
            "(bench/cpu_profile.py; the whole plan adds call overheads)"))


def _profile_times(profile: str, artifact: str) -> dict[str, float]:
    try:
        data = json.loads(Path(profile).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--profile {profile}: cannot read it ({e}); expected the JSON "
                         "`python -m deploy.bench.gpu_profile ARTIFACT --json F` writes") from None
    results = data if isinstance(data, list) else [data]
    mine = [r for r in results if Path(str(r.get("artifact", ""))).name == Path(artifact).name]
    chosen = (mine or results or [{}])[0]
    if not isinstance(chosen, dict) or "launches" not in chosen:
        raise UsageError(f"--profile {profile}: no `launches` list; expected the JSON "
                         "`python -m deploy.bench.gpu_profile ARTIFACT --json F` writes")
    out: dict[str, float] = {}
    for launch in chosen["launches"]:
        out[launch["symbol"]] = out.get(launch["symbol"], 0.0) + float(launch["ms"])
    return out


# ---- what each step shows -------------------------------------------------------------------

def value_bytes(v: dict) -> tuple[int, str]:
    """(bytes with every symbol at 1, the symbols' product: "" for fixed sizes)."""
    n, syms = np.dtype(v["dtype"]).itemsize, []
    for d in v["shape"]:
        if isinstance(d, int):
            n *= d
        else:
            syms.append(dim_text(d))
    return n, "·".join(syms)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _bytes_text(n: int, syms: str) -> str:
    return _fmt_bytes(n) + (f" × {syms}" if syms else "")


def _value_text(vid: int, values: dict) -> str:
    v = values.get(str(vid))
    if v is None:
        return f"v{vid}"
    shape = ", ".join(dim_text(d) for d in v["shape"])
    return f"v{vid} {v['dtype']}[{shape}]"


def _template(kernel: dict, gpu_plan: dict | None) -> str:
    """What code each stage is: GPU launch templates, else CPU templates / gemm / loop."""
    if gpu_plan:
        names = [x.get("template") or "?" for x in gpu_plan.get("launches", [])]
    else:
        names = [s.get("template") or ("gemm" if "gemm_tile" in s else "loop")
                 for s in kernel.get("schedule", [])]
    return " + ".join(dict.fromkeys(names)) or "?"


def step_rows(manifest: dict, times: dict[str, float]) -> list[dict]:
    """One row per step: what the page draws and the table lists."""
    values = manifest.get("values", {})
    kernels = {k["symbol"]: k for k in manifest.get("kernels", [])}
    plans = manifest.get("gpu", {}).get("kernels", {})
    rows = []
    for i, s in enumerate(manifest.get("steps", [])):
        kind = s.get("kind", "kernel")
        k = kernels.get(s.get("symbol"), {})
        sizes = [value_bytes(values[str(v)]) for v in s["outputs"] if str(v) in values]
        fixed, syms = sum(n for n, _ in sizes), sorted({x for _, x in sizes if x})
        rows.append({
            "index": i, "kind": kind, "symbol": s.get("symbol", ""),
            "op": s.get("op") or ("view" if kind == "view" else "?"),
            "node": s.get("node", ""), "note": k.get("note", ""),
            "template": _template(k, plans.get(s.get("symbol"))) if kind == "kernel" else "",
            "inputs": [v for v in s.get("inputs", []) if v is not None],
            "outputs": list(s["outputs"]), "bytes": fixed, "bytes_text": _bytes_text(
                fixed, " + ".join(syms) if len(syms) > 1 else "".join(syms)) if sizes else "",
            "out_text": ", ".join(_value_text(v, values) for v in s["outputs"]),
            "ms": times.get(s.get("symbol")) if kind == "kernel" else None,
            "tuned": bool(k.get("tuned")), "codegen": k.get("codegen", "")})
    return rows


# ---- drawing ----------------------------------------------------------------------------------

def _layout(rows: list[dict], manifest: dict) -> tuple[list[dict], list[tuple[int, int]]]:
    """Boxes (an ``inputs`` box, the steps, an ``outputs`` box) with y positions, and the edges
    between box indices (producer -> consumer of a value)."""
    values = manifest.get("values", {})
    ins = {"kind": "io", "label": "inputs", "outputs": manifest.get("input_ids", []),
           "text": ", ".join(f"{s['name']}: " + _value_text(v, values).split(" ", 1)[-1]
                             for s, v in zip(manifest.get("inputs", []),
                                             manifest.get("input_ids", [])))}
    outs = {"kind": "io", "label": "outputs", "inputs": manifest.get("output_ids", []),
            "text": ", ".join(f"{s['name']}: " + _value_text(v, values).split(" ", 1)[-1]
                              for s, v in zip(manifest.get("outputs", []),
                                              manifest.get("output_ids", [])))}
    boxes = [ins, *rows, outs]
    y = 10
    for b in boxes:
        b["y"], b["h"] = y, VIEW_H if b["kind"] == "view" else KERNEL_H
        y += b["h"] + GAP
    producer, edges = {}, []
    for i, b in enumerate(boxes):
        for v in b.get("inputs", []):
            if v in producer:
                edges.append((producer[v], i))
        for v in b.get("outputs", []):
            producer[v] = i
    return boxes, sorted(set(edges))


def _lanes(edges: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Long edges run left of the boxes, each in a lane no overlapping edge uses."""
    ends: list[int] = []  # per lane, the last box its current edge reaches
    out = {}
    for a, b in sorted((e for e in edges if e[1] - e[0] > 1), key=lambda e: (e[0], e[1])):
        lane = next((i for i, end in enumerate(ends) if end <= a), len(ends))
        if lane == len(ends):
            ends.append(b)
        ends[lane] = b
        out[(a, b)] = lane
    return out


def _svg(boxes: list[dict], edges: list[tuple[int, int]], max_ms: float) -> str:
    lanes = _lanes(edges)
    max_lane = (LEFT - 20) // LANE
    height = boxes[-1]["y"] + boxes[-1]["h"] + 10
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + BOX_W + 20}" '
             f'height="{height}" class="flow">'),
             ('<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="6" '
             'markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#777"/>'
             '</marker></defs>')]
    for a, b in edges:
        top, bot = boxes[a], boxes[b]
        if (a, b) not in lanes:  # the next box: straight down
            x = LEFT + BOX_W // 2
            parts.append(f'<line x1="{x}" y1="{top["y"] + top["h"]}" x2="{x}" y2="{bot["y"]}" '
                         'class="edge" marker-end="url(#arrow)"/>')
            continue
        x = LEFT - 12 - (lanes[(a, b)] % max_lane) * LANE
        y1, y2 = top["y"] + top["h"] // 2, bot["y"] + bot["h"] // 2
        parts.append(f'<path d="M{_left(top)},{y1} H{x} V{y2} H{_left(bot)}" class="edge long" '
                     'marker-end="url(#arrow)"/>')
    for b in boxes:
        parts.append(_box(b, max_ms))
    parts.append("</svg>")
    return "\n".join(parts)


def _left(b: dict) -> int:
    """Where a box's left side is (views are drawn narrower)."""
    return LEFT + VIEW_INDENT if b["kind"] == "view" else LEFT


def _box(b: dict, max_ms: float) -> str:
    x, y, h, kind = LEFT, b["y"], b["h"], b["kind"]
    color = KIND_COLOR[kind]
    if kind == "io":
        return (f'<g><rect x="{x}" y="{y}" width="{BOX_W}" height="{h}" rx="6" fill="#eef7ef" '
                f'stroke="{color}"/><text x="{x + 10}" y="{y + 22}" class="t1">{b["label"]}'
                f'</text><text x="{x + 10}" y="{y + 42}" class="t2">{escape(_cut(b["text"], 96))}'
                "</text></g>")
    tip = escape("\n".join(filter(None, [
        f"{b['symbol'] or kind} {b['op']}  node {b['node']}", b["note"],
        b["template"] and f"template: {b['template']}", f"writes {b['out_text']}",
        b["bytes_text"] and f"output bytes {b['bytes_text']}",
        b["ms"] is not None and f"time {b['ms']:.4f} ms"])))
    if kind == "view":
        return (f'<g><title>{tip}</title><rect x="{x + VIEW_INDENT}" y="{y}" '
                f'width="{BOX_W - 2 * VIEW_INDENT}" height="{h}" rx="4" fill="#f6f6f6" '
                f'stroke="{color}" stroke-dasharray="4 3"/><text x="{x + VIEW_INDENT + 10}" '
                f'y="{y + 17}" class="t3">view → {escape(_cut(b["out_text"], 80))}</text></g>')
    share = (b["ms"] or 0) / max_ms if max_ms else 0
    fill = f"rgba(230, 120, 30, {0.08 + 0.5 * share:.3f})" if b["ms"] is not None else "#fff"
    head = f"{b['symbol'] or 'host'} · {b['op']}" + (f" · {b['template']}" if b["template"]
                                                     else "")
    right = " · ".join(filter(None, [b["ms"] is not None and f"{b['ms']:.3f} ms",
                                     b["bytes_text"]]))
    anchor = f'<a href="#row-{escape(b["symbol"])}">' if b["symbol"] else "<a>"
    return "".join([
        f'<g class="step">{anchor}<title>{tip}</title>',
        (f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{h}" rx="6" fill="{fill}" '
        f'stroke="{color}" stroke-width="1.5"/>'),
        f'<rect x="{x + 1}" y="{y + h - 4}" width="{(BOX_W - 2) * share:.1f}" height="3" '
        'fill="#d9661a"/>' if b["ms"] else "",
        f'<text x="{x + 10}" y="{y + 18}" class="t1">{escape(_cut(head, 60))}</text>',
        f'<text x="{x + BOX_W - 10}" y="{y + 18}" class="t1 r">{escape(right)}</text>',
        (f'<text x="{x + 10}" y="{y + 35}" class="t2">{escape(_cut(b["note"] or b["node"], 86))}'
        "</text>"),
        f'<text x="{x + 10}" y="{y + 49}" class="t3">{escape(_cut(b["out_text"], 94))}</text>',
        "</a></g>"])


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


# ---- the page ---------------------------------------------------------------------------------

def _table(rows: list[dict], total_ms: float) -> str:
    head = ("<tr><th>#</th><th>kernel</th><th>op</th><th>node</th><th>template</th>"
            "<th>note</th><th>output bytes</th><th>ms</th><th>%</th></tr>")
    body = []
    for r in rows:
        if r["kind"] != "kernel":
            continue
        ms = r["ms"]
        body.append(
            f'<tr id="row-{escape(r["symbol"])}"><td>{r["index"]}</td>'
            f'<td>{escape(r["symbol"])}{" (tuned)" if r["tuned"] else ""}</td>'
            f'<td>{escape(r["op"])}</td><td>{escape(r["node"])}</td>'
            f'<td>{escape(r["template"])}</td><td>{escape(r["note"])}</td>'
            f'<td data-v="{r["bytes"]}">{escape(r["bytes_text"])}</td>'
            f'<td data-v="{ms if ms is not None else -1}">'
            f'{"" if ms is None else f"{ms:.4f}"}</td>'
            f'<td>{"" if ms is None or not total_ms else f"{100 * ms / total_ms:.1f}"}</td></tr>')
    return f'<table id="kernels"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 20px; color: #222; }
h1 { font-size: 20px; margin: 0 0 6px; } .meta { color: #555; margin: 2px 0; }
.flow text { font: 12px ui-monospace, monospace; fill: #222; } .flow .t1 { font-weight: 600; }
.flow .t2 { fill: #444; } .flow .t3 { fill: #666; font-size: 11px; }
.flow .r { text-anchor: end; } .edge { stroke: #999; fill: none; stroke-width: 1.2; }
.edge.long { stroke: #7d9cc9; } .step:hover rect:first-of-type { stroke-width: 3; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  border: 2px solid; vertical-align: -2px; }
table { border-collapse: collapse; margin-top: 20px; font-size: 12px; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; cursor: pointer; } tr:target { background: #fff3c4; }
"""

SCRIPT = """
document.querySelectorAll('#kernels th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = document.querySelector('#kernels tbody');
    var rows = Array.prototype.slice.call(body.rows);
    var down = th.dataset.down !== '1'; th.dataset.down = down ? '1' : '0';
    function key(r) { var c = r.cells[col]; var v = c.dataset.v !== undefined ? c.dataset.v :
      c.textContent; var n = parseFloat(v); return isNaN(n) ? v : n; }
    rows.sort(function (a, b) { var x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (down ? -1 : 1); });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


def render_html(path: str, report: dict, manifest: dict, times: dict[str, float],
                time_note: str) -> str:
    """The page for the artifact at ``path`` (``report``: ``inspect_report``'s data)."""
    rows = step_rows(manifest, times)
    boxes, edges = _layout(rows, manifest)
    max_ms = max((r["ms"] for r in rows if r["ms"] is not None), default=0.0)
    total_ms = sum(r["ms"] for r in rows if r["ms"] is not None)
    t = report["target"]
    counts = {k: sum(r["kind"] == k for r in rows) for k in ("kernel", "host", "view")}
    legend = "".join(f'<span><i style="border-color:{KIND_COLOR[k]}"></i>{k}</span>'
                     for k in ("kernel", "host", "view"))
    meta = [
        (f"target {escape(str(t.get('name')))} ({escape(str(t.get('kind')))}, backend "
        f"{escape(str(t.get('backend')))}) · {counts['kernel']} kernels, {counts['host']} host "
        f"ops, {counts['view']} views · arena {_fmt_bytes(report['arena_bytes'])} · weights "
        f"{_fmt_bytes(report['weights']['bytes'])} in {report['weights']['count']} arrays"),
        escape(time_note) + (f" · sum {total_ms:.3f} ms" if times else ""),
        ("Boxes in step order; lines join a step to the steps that read what it writes (long "
        "ones run on the left). Hover a box for details; click a kernel for its table row; "
        "click a column title to sort.")]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(Path(path).name)}: deploy inspect</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{escape(Path(path).name)}</h1>",
        *(f'<p class="meta">{m}</p>' for m in meta),
        f'<p class="legend">{legend}</p>',
        _svg(boxes, edges, max_ms),
        _table(rows, total_ms),
        f"<script>{SCRIPT}</script>", "</body></html>", ""])


def write_html(path: str, out: str, report: dict, manifest: dict, profile: str | None = None,
               runs: int = 3) -> tuple[Path, str]:
    """Write the page; returns its path and the note on where times came from."""
    times, note = kernel_times(path, manifest, profile, runs)
    target = Path(out)
    target.write_text(render_html(path, report, manifest, times, note), encoding="utf-8")
    return target, note
