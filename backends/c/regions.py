"""One OpenMP parallel region per kernel where its stages are each one parallel loop.

A kernel of several stages (a LayerNorm's mean, variance and normalized output) renders each
stage as its own ``#pragma omp parallel for``: one fork and join of the thread team per stage.
``one_region`` rewrites such a kernel's stage blocks into a single ``#pragma omp parallel``
whose stages are ``#pragma omp for`` loops: the threads are woken once per kernel, and the
implicit barrier at the end of each ``omp for`` keeps the stages in order (a stage reads what
the one before wrote). Taken only where every block is exactly ``{ #pragma omp parallel for
...; for (...) { ... } }`` (nothing before or after its loop, no other parallel construct, no
``return``), so no statement outside a loop would run once per thread.
"""
from __future__ import annotations

import re

PARALLEL_FOR = re.compile(r"^(\s*)#pragma omp parallel for((?: collapse\(\d+\))? schedule\(static\))$")


def one_region(blocks: list[list[str]]) -> list[str] | None:
    """The stage blocks as one parallel region, or None where they do not all qualify."""
    if len(blocks) < 2:
        return None
    out: list[str] = []
    for block in blocks:
        loop = _loop(block)
        if loop is None:
            return None
        head, pragma, rest = loop
        m = PARALLEL_FOR.match(pragma)
        out += head + [f"{m.group(1)}#pragma omp for{m.group(2)}"] + rest
    return ["  #pragma omp parallel", "  {"] + out + ["  }"]


def _loop(block: list[str]) -> tuple[list[str], str, list[str]] | None:
    """(the opening braces, the pragma, the loop and closing braces) of a block that is one
    parallel loop and nothing else; else None."""
    lines = [line for line in block if line.strip()]
    i = 0
    while i < len(lines) and lines[i].strip() == "{":
        i += 1
    if i + 1 >= len(lines) or not PARALLEL_FOR.match(lines[i]) or \
            not lines[i + 1].lstrip().startswith("for ("):
        return None
    rest = lines[i + 1:]
    if any("omp parallel" in line or "return" in line for line in rest):
        return None
    depth, end = 0, None
    for j, line in enumerate(rest):
        depth += line.count("{") - line.count("}")
        if depth == 0:
            end = j
            break
    if end is None or any(line.strip() != "}" for line in rest[end + 1:]):
        return None
    return lines[:i], lines[i], rest
