"""Target YAML: the shipped target files edited into wrong types, missing keys, negative
sizes, unknown keys, alias bombs, non-UTF-8 bytes, 10 MB files, deep nesting and byte flips.
A malformed file must be refused with a TargetError; a valid edit must load as written, and
a CPU target must compile a model that agrees with ONNX Runtime."""
from __future__ import annotations

from pathlib import Path

import deploy
import numpy as np
import yaml
from deploy.targets.target import GPU_REQUIRED, SCHEMA, load_target

from .judge import Result, Wrong, accepted, check_against_ort, cli, judge

BASES = ("host", "x86_64-avx2", "h100", "mi300x")
WRONG_VALUES = ([1, 2], {"a": 1}, "text", 3.5, True, None, -1, 10 ** 30, "", [])
REQUIRED = [k for k, (_, required, _) in SCHEMA.items() if required]
INT_KEYS = [k for k, (types, _, _) in SCHEMA.items() if types[0] is int]


def _pick(rng, seq):
    return seq[int(rng.integers(0, len(seq)))]


def _wrong_type(d, rng):
    key = _pick(rng, sorted(d))
    types = SCHEMA[key][0]
    value = _pick(rng, [v for v in WRONG_VALUES if not isinstance(v, types) or isinstance(v, bool)])
    d[key] = value
    return "wrong-type"


def _missing(d, rng):
    keys = REQUIRED + ([k for k in GPU_REQUIRED if k in d] if d["kind"] == "gpu" else [])
    del d[_pick(rng, keys)]
    return "missing-key"


def _negative(d, rng):
    d[_pick(rng, INT_KEYS)] = -int(rng.integers(1, 1 << 20))
    return "negative-size"


def _unknown(d, rng):
    d[_pick(rng, ["vectorbits", "Kind", "extra", "cores ", "isa2", "x" * 100])] = 1
    return "unknown-key"


def _bad_value(d, rng):
    key, value = _pick(rng, [("kind", "tpu"), ("backend", "llvm"), ("vector_bits", 300),
                             ("warp_size", 48), ("preferred_layout", "NWHC"),
                             ("backends", ["c", "fortran"]), ("peak_tflops", {"fp7": 1}),
                             ("peak_tflops", {"fp32": -3}), ("peak_tflops", {"fp32": "fast"}),
                             ("arch", "sm_x"), ("isa", [[1]]), ("cc_flags", [{"a": 1}])])
    if key == "arch" and d["kind"] != "gpu":
        key, value = "kind", "GPU"
    d[key] = value
    return f"bad-{key}"


MALFORMED = [_wrong_type, _missing, _negative, _unknown, _bad_value]


def _valid_edit(d, rng):
    """Edits that leave a valid target (what the loaded Target must then say)."""
    kind = _pick(rng, ["description", "cores", "reorder", "vector_bits"])
    if kind == "description":
        d["description"] = "fuzzed: " + "".join(_pick(rng, "abc é😀\t:#'\"") for _ in range(20))
    elif kind == "cores":
        d["cores"] = int(rng.integers(0, 64))
    elif kind == "vector_bits" and d["kind"] == "cpu":
        d["vector_bits"] = int(_pick(rng, [128, 256]))
    else:
        d = dict(reversed(list(d.items())))
    return f"valid-{kind}", d


def _alias_bomb(depth: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, depth):
        lines.append(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def text_case(rng, text: str) -> tuple[str, bytes, bool]:
    """(label, file bytes, must be refused) for the text-level cases."""
    kind = _pick(rng, ["alias-bomb", "alias-bomb-value", "non-utf8", "latin1", "10mb-comment",
                       "10mb-value", "10mb-keys", "deep-nesting", "python-tag", "two-documents",
                       "nesting-under-limit", "long-list-under-limit",
                       "not-a-mapping", "empty", "duplicate-key", "byte-flips", "nul", "tabs"])
    data, refuse = text.encode(), True
    if kind == "alias-bomb":
        data = _alias_bomb().encode()
    elif kind == "alias-bomb-value":  # the bomb inside a real key
        data = (_alias_bomb() + text).encode().replace(b"\ncores: 0", b"\ncores: *a8")
        if b"*a8" not in data:
            data += b"isa: *a8\n"
    elif kind == "non-utf8":
        data = text.replace("description: ", "description: \udcff").encode("utf-8",
                                                                          "surrogateescape")
        data = data if b"\xff" in data else b"\xff\xfe" + data
    elif kind == "latin1":
        data = ("# caf\xe9\n" + text).encode("latin-1")
    elif kind == "10mb-comment":
        data = text.encode() + b"#" + b"x" * (10 << 20) + b"\n"
        refuse = False  # a comment: the same target, or a refusal for the size
    elif kind == "10mb-value":
        data = text.encode() + b"description2: " + b"y" * (10 << 20) + b"\n"
    elif kind == "10mb-keys":
        data = text.encode() + b"".join(b"k%d: 1\n" % i for i in range((10 << 20) // 8))
    elif kind == "deep-nesting":
        data = text.encode() + b"isa: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"
    elif kind == "nesting-under-limit":  # what fits in the size limit
        data = text.encode() + b"isa: " + b"[" * 30_000 + b"]" * 30_000 + b"\n"
    elif kind == "long-list-under-limit":
        data = text.encode() + b"isa: [" + b"avx2, " * 10_000 + b"fma]\n"
        refuse = "isa:" in text  # (a key given twice) else a valid, long list
    elif kind == "python-tag":
        data = text.encode() + b"zz: !!python/object/apply:os.system ['echo pwned']\n"
    elif kind == "two-documents":
        data = text.encode() + b"---\n" + text.encode()
    elif kind == "not-a-mapping":
        data = _pick(rng, [b"- a\n- b\n", b"42\n", b"'text'\n", b"null\n", b"[]\n"])
    elif kind == "empty":
        data = b""
    elif kind == "duplicate-key":  # which one wins is ambiguous: refuse
        data = text.encode() + b"kind: gpu\n" if "kind: cpu" in text else \
            text.encode() + b"kind: cpu\n"
    elif kind == "byte-flips":
        buf = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            buf[int(rng.integers(0, len(buf)))] = int(rng.integers(0, 256))
        data, refuse = bytes(buf), False
    elif kind == "nul":
        data = text.encode().replace(b"\n", b"\n\x00", 1)
    else:
        data = text.replace("\n", "\n\t", 1).encode()
    return kind, data, refuse


def case(rng: np.random.Generator, seeds, tmp: Path) -> tuple[str, Result]:
    name = _pick(rng, BASES)
    source = Path(load_target(name).source)
    text = source.read_text()
    path = tmp / "target.yaml"
    want = None  # the loaded target's expected fields, for valid edits
    roll = rng.random()
    if roll < 0.45:
        d = yaml.safe_load(text)
        label = _pick(rng, MALFORMED)(d, rng)
        path.write_text(yaml.safe_dump(d, allow_unicode=True, sort_keys=False))
        refuse = True
    elif roll < 0.6:
        label, d = _valid_edit(yaml.safe_load(text), rng)
        path.write_text(yaml.safe_dump(d, allow_unicode=True, sort_keys=False))
        refuse, want = False, d
    else:
        label, data, refuse = text_case(rng, text)
        path.write_bytes(data)
        if label == "10mb-comment":
            want = yaml.safe_load(text)
    label = f"{name}:{label}"
    if rng.random() < 0.1:
        result = cli(["targets", "show", str(path)])
        if result.outcome == "correct" and refuse:
            result = Result("silent", f"deploy targets show accepted {label}")
        return f"cli-{label}", result
    if refuse:
        return label, judge(lambda: load_target(path), accepted(label))
    return label, judge(lambda: load_target(path), lambda t: _check(t, want, seeds, rng, tmp))


def _check(target, want: dict | None, seeds, rng, tmp: Path) -> None:
    if want is not None:
        got = target.to_dict()
        for key, value in want.items():
            value = list(value) if isinstance(value, (list, tuple)) else value
            if key == "vector_bits" and target.arch == "native":
                continue  # (capped by this CPU)
            if key in got and got[key] != value and not (
                    isinstance(value, dict) and got[key] == {k: float(v) for k, v in value.items()}):
                raise Wrong(f"the target loaded {key}={got[key]!r}, the file says {value!r}")
    if target.kind == "cpu" and want is not None and rng.random() < 0.3:
        model = seeds.index["models"]["mlp"]
        mod = deploy.compile(model, target=target).load(tmp / "m.dpk")
        check_against_ort(model, mod, rng)
