"""Generate the supported-ATen-ops section of docs/torch.md from the conversion table.

    python -m deploy.frontends.torch.docs            # print the section
    python -m deploy.frontends.torch.docs --write    # rewrite it in docs/torch.md
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import ATEN, KEEP, op_name
from .registry import missing_core_ops

BEGIN, END = "<!-- BEGIN GENERATED: ATen ops -->", "<!-- END GENERATED: ATen ops -->"
FAMILIES = ["elementwise", "movement", "reduction", "nn", "misc"]


def ops_table() -> str:
    """The generated markdown block: supported ATen overloads per converter family."""
    by_family: dict[str, list[str]] = {f: [] for f in FAMILIES}
    for target, entry in ATEN.items():
        if not hasattr(target, "_schema") or missing_core_ops(entry):
            continue
        family = entry.fn.__module__.rsplit("convert_", 1)[-1]
        by_family.setdefault(family, []).append(op_name(target))
    total = sum(len(v) for v in by_family.values())
    kept = ", ".join(f"`{op_name(k)}`" for k in KEEP)
    intro = (f"{total} ATen overloads convert today (plus Python symbolic-size arithmetic and "
             f"`operator.getitem`). Kept whole by the decomposition: {kept}.")
    lines = [BEGIN, "", intro, ""]
    for family, names in by_family.items():
        lines.append(f"**{family}** ({len(names)}): " + ", ".join(
            f"`{n.removeprefix('aten.')}`" for n in sorted(names)))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write(path: Path) -> None:
    text = path.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    path.write_text(text[:start] + ops_table() + text[stop:])


if __name__ == "__main__":
    if "--write" in sys.argv:
        write(Path(__file__).resolve().parents[2] / "docs" / "torch.md")
    else:
        print(ops_table())
