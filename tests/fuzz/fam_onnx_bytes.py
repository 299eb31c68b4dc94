"""ONNX bytes: a seed model's serialized bytes cut short or with bytes flipped, inserted,
deleted or repeated. deploy must refuse the file with a DeployError or compile a model that
agrees with ONNX Runtime on the same bytes."""
from __future__ import annotations

from pathlib import Path

import deploy
import numpy as np

from .judge import Result, check_against_ort, cli, judge

INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0F, 0xF0)
BIG_VARINT = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F])  # ~2**60


def mutate(data: bytearray, rng: np.random.Generator) -> str:
    """Change ``data`` in place; returns what was done."""
    n = len(data)
    kind = rng.choice(["truncate", "flip-bits", "set-bytes", "delete", "repeat", "insert",
                       "big-varint"], p=[0.2, 0.25, 0.2, 0.1, 0.1, 0.05, 0.1])
    if kind == "truncate":
        del data[int(rng.integers(0, n)):]
    elif kind == "flip-bits":
        for _ in range(int(rng.integers(1, 5))):
            data[int(rng.integers(0, n))] ^= 1 << int(rng.integers(0, 8))
    elif kind == "set-bytes":
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(0, n))] = int(rng.choice(INTERESTING)) \
                if rng.random() < 0.5 else int(rng.integers(0, 256))
    elif kind in ("delete", "repeat"):
        at, size = int(rng.integers(0, n)), int(rng.integers(1, 17))
        if kind == "delete":
            del data[at:at + size]
        else:
            data[at:at] = data[at:at + size]
    elif kind == "insert":
        at = int(rng.integers(0, n + 1))
        data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
    else:  # a length or dim field made enormous
        at = int(rng.integers(0, n))
        data[at:at + 1] = BIG_VARINT
    return str(kind)


def case(rng: np.random.Generator, seeds, tmp: Path) -> tuple[str, Result]:
    name = str(rng.choice(sorted(seeds.index["models"])))
    data = bytearray(seeds.model_bytes(name))
    kind = mutate(data, rng)
    if rng.random() < 0.3:
        mutate(data, rng)  # two mutations at times
    path = tmp / "model.onnx"
    path.write_bytes(bytes(data))
    check = lambda mod: check_against_ort(bytes(data), mod, rng)
    if rng.random() < 0.1:  # the command line: exit 1 and one line, or an artifact
        result = cli(["compile", str(path), "-o", str(tmp / "m.dpk")])
        if result.outcome == "correct":
            result = judge(lambda: deploy.load(tmp / "m.dpk"), check)
        return f"cli-{kind}", result
    return str(kind), judge(lambda: deploy.compile(str(path)).load(tmp / "m.dpk"), check)
