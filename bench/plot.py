"""Plot the benchmark tables of docs/benchmarks.md as bar charts of ratios (needs matplotlib).

    python -m deploy.bench.plot docs/benchmarks.md docs/benchmarks.png

Reads every markdown table with a ``deploy/...`` ratio column above the "## History" heading
and draws one panel per table:
deploy's time divided by each peer's, per model (below 1 means deploy is faster).
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path


def tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading, header cells, rows) of every markdown table, under its nearest ## heading."""
    out, section, sub, heading, rows, header = [], "", "", "", [], None
    for line in text.splitlines() + [""]:
        if line.startswith("## History"):
            break  # earlier measurements: not plotted
        if line.startswith("## "):
            section = sub = heading = line[3:].strip()
        elif line.startswith("### "):
            sub = heading = f"{section}: {line[4:].strip()}"
        elif line.startswith("#### "):
            heading = f"{sub.split(': ')[-1]}: {line[5:].strip()}"
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif header is not None:
            out.append((heading, header, rows))
            header, rows = None, []
    return out


def _number(cell: str) -> float:
    """A table cell as a number: markdown emphasis (``**0.83**``) dropped, nan when empty."""
    text = cell.strip().strip("*").strip()
    return float(text) if text else float("nan")


def main(src: str, dst: str) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(h, hdr, rows) for h, hdr, rows in tables(Path(src).read_text())
              if any(c.startswith("deploy/") for c in hdr)]
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4.5 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (heading, header, rows) in zip(axes.flat, panels):
        ratios = [k for k, c in enumerate(header) if c.startswith("deploy/")]
        width = 0.8 / len(ratios)
        for n, k in enumerate(ratios):
            xs = [i + n * width for i in range(len(rows))]
            ax.bar(xs, [_number(r[k]) for r in rows], width, label=header[k])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(ratios) - 1) / 2 for i in range(len(rows))])
        ax.set_xticklabels([r[0] for r in rows], rotation=20, ha="right")
        ax.set_title("\n".join(textwrap.wrap(heading, 72)), fontsize=9)
        ax.set_ylabel("time ratio (below 1: deploy faster)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
