"""Run-time inputs: what callers pass to ``Module.run`` — wrong names, missing and extra
inputs, wrong dtypes, Python lists, object arrays, wrong ranks and shapes, zero-size batches,
non-contiguous, Fortran-ordered, negative-stride, read-only, unaligned and broadcast arrays,
NaN and Inf. A malformed call ends in an InputError; an accepted one must give ONNX Runtime's
result on the same values, leave the caller's arrays untouched, and return outputs that a
later run does not overwrite."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .judge import Result, Wrong, agrees, judge, ort_run, random_feeds


def _pick(rng, seq):
    return seq[int(rng.integers(0, len(seq)))]


# ---- layouts: the same values in another memory layout (must give the same result) ------

def fortran(x, rng):
    return np.asfortranarray(x)


def strided(x, rng):
    big = np.zeros(tuple(2 * d for d in x.shape) or (), x.dtype)
    view = big[tuple(slice(None, None, 2) for _ in x.shape)]
    view[...] = x
    return view


def negative_stride(x, rng):
    if x.ndim == 0:
        return x
    flipped = np.ascontiguousarray(x[::-1])
    return flipped[::-1]


def read_only(x, rng):
    x = x.copy()
    x.setflags(write=False)
    return x


def unaligned(x, rng):
    buf = np.zeros(x.nbytes + 1, np.uint8)
    view = buf[1:].view(x.dtype).reshape(x.shape)
    view[...] = x
    return view


def broadcast(x, rng):
    if x.ndim == 0 or x.shape[0] < 1:
        return x
    row = x[:1].copy()
    x[...] = row  # the reference sees the same repeated rows
    return np.broadcast_to(row, x.shape)


def transposed(x, rng):
    return x.T.copy().T


LAYOUTS = [fortran, strided, negative_stride, read_only, unaligned, broadcast, transposed]


def special_values(x, rng):
    if x.dtype.kind != "f" or x.size == 0:
        return x
    flat = x.reshape(-1)
    for _ in range(int(rng.integers(1, 4))):
        flat[int(rng.integers(0, flat.size))] = _pick(rng, [np.nan, np.inf, -np.inf, 3e38,
                                                            -3e38, 1e-45, -0.0])
    return x


# ---- the case ------------------------------------------------------------------------

def case(rng: np.random.Generator, seeds, tmp: Path) -> tuple[str, Result]:
    name = _pick(rng, sorted(seeds.index["artifacts"]))
    mod = seeds.modules[name]
    specs = mod.input_specs
    batch = int(rng.integers(1, 5))
    feeds = random_feeds(specs, rng, batch)
    ref_feeds = {k: v.copy() for k, v in feeds.items()}
    target = _pick(rng, [s.name for s in specs])
    roll = rng.random()
    if roll < 0.35:  # valid values in another layout or container: must be correct
        kind = _pick(rng, [f.__name__ for f in LAYOUTS] + ["nan-inf", "list-order", "tuple",
                                                           "python-list", "masked", "matrix",
                                                           "big-endian", "batch"])
        given = _valid(kind, feeds, ref_feeds, target, specs, rng, seeds, name)
        return f"{name}:{kind}", judge(lambda: _run(mod, given),
                                       lambda outs: _check(outs, given, ref_feeds, mod, seeds,
                                                           name, feeds_for_ort=ref_feeds))
    kind, given = _malformed(feeds, target, specs, rng)
    return f"{name}:{kind}", judge(lambda: _run(mod, given), _accepted_malformed(kind))


def _run(mod, given):
    return mod.run(given)


def _valid(kind, feeds, ref_feeds, target, specs, rng, seeds, name):
    if kind == "nan-inf":
        special_values(feeds[target], rng)
        ref_feeds[target] = feeds[target].copy()
        return feeds
    if kind == "list-order":
        return [feeds[s.name] for s in specs]
    if kind == "tuple":
        return tuple(feeds[s.name] for s in specs)
    if kind == "python-list":  # nested Python numbers: float64 / int64 once numpy reads them
        feeds[target] = feeds[target].tolist()
        return feeds
    if kind == "masked":
        feeds[target] = np.ma.masked_array(feeds[target], mask=False)
        return feeds
    if kind == "matrix":
        if feeds[target].ndim == 2:
            feeds[target] = np.asmatrix(feeds[target])
        return feeds
    if kind == "big-endian":
        feeds[target] = feeds[target].astype(feeds[target].dtype.newbyteorder(">"))
        return feeds
    if kind == "batch":  # another batch size: symbolic inputs accept it, static ones refuse
        size = int(_pick(rng, [0, 1, 7, 64]))
        for s in specs:
            if not s.is_symbolic:
                continue
            shape = tuple(d if isinstance(d, int) else size for d in s.shape)
            feeds[s.name] = np.random.default_rng(1).standard_normal(shape).astype(s.dtype)
            ref_feeds[s.name] = feeds[s.name].copy()
        return feeds
    layout = {f.__name__: f for f in LAYOUTS}[kind]
    if layout is broadcast:
        feeds[target] = broadcast(ref_feeds[target], rng)
        return feeds
    feeds[target] = layout(feeds[target], rng)
    return feeds


def _check(outs, given, ref_feeds, mod, seeds, name, feeds_for_ort):
    """ONNX Runtime's result on the same values; the caller's arrays untouched; outputs not
    overwritten by a later run."""
    agrees(outs, seeds.model_bytes(name), feeds_for_ort,
           lambda: ort_run(seeds.sessions[name], feeds_for_ort))
    if isinstance(given, dict):
        pairs = [(given[k], ref_feeds[k]) for k in ref_feeds if k in given]
    else:
        pairs = list(zip(given, (ref_feeds[s.name] for s in mod.input_specs)))
    for got, want in pairs:
        if isinstance(got, np.ndarray) and got.dtype == want.dtype and \
                not np.array_equal(got, want, equal_nan=True):
            raise Wrong("the run changed the caller's input array")
    kept = [np.array(o, copy=True) for o in outs]
    other = {k: np.ascontiguousarray(v[::-1] if v.ndim else v) for k, v in ref_feeds.items()}
    mod.run(other)
    for a, b in zip(outs, kept):
        if not np.array_equal(a, b, equal_nan=True):
            raise Wrong("a later run overwrote the outputs an earlier run returned")


def _malformed(feeds, target, specs, rng):
    spec = next(s for s in specs if s.name == target)
    x = feeds[target]
    kind = _pick(rng, ["wrong-name", "missing", "extra", "wrong-dtype", "object-array",
                       "wrong-rank", "wrong-shape", "not-a-mapping", "none-value", "strings",
                       "too-many-positional", "too-few-positional", "non-str-key",
                       "ragged-list", "scalar", "symbolic-mismatch"])
    if kind == "wrong-name":
        feeds[target + "_"] = feeds.pop(target)
    elif kind == "missing":
        feeds.pop(target)
    elif kind == "extra":
        feeds["extra"] = x.copy()
    elif kind == "wrong-dtype":
        choices = [np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_,
                   np.complex64, np.float32]
        dtype = _pick(rng, [d for d in choices if np.dtype(d) != np.dtype(spec.dtype)])
        feeds[target] = x.astype(dtype)
        kind = f"wrong-dtype-{np.dtype(dtype).name}"
    elif kind == "object-array":
        feeds[target] = x.astype(object)
    elif kind == "wrong-rank":
        feeds[target] = x[None] if rng.random() < 0.5 or x.ndim == 0 else x.reshape(-1)
        if feeds[target].ndim == x.ndim:
            feeds[target] = x[None]
    elif kind == "wrong-shape":
        if x.ndim == 0:
            feeds[target] = x.reshape(1)
        else:
            axis = int(rng.integers(0, x.ndim))
            fixed = [k for k, d in enumerate(spec.shape) if isinstance(d, int)]
            axis = axis if axis in fixed or not fixed else _pick(rng, fixed)
            grown = list(x.shape)
            grown[axis] += int(rng.integers(1, 3))
            feeds[target] = np.resize(x, grown)
    elif kind == "not-a-mapping":
        value = _pick(rng, [None, "x", 3, {1, 2}, b"bytes", 2.5, object()])
        return f"not-a-mapping-{type(value).__name__}", value
    elif kind == "none-value":
        feeds[target] = None
    elif kind == "strings":
        feeds[target] = np.full(x.shape, "abc")
    elif kind == "too-many-positional":
        return kind, [*feeds.values(), x.copy()]
    elif kind == "too-few-positional":
        return kind, list(feeds.values())[:-1]
    elif kind == "non-str-key":
        feeds[0] = feeds.pop(target)
    elif kind == "ragged-list":
        feeds[target] = [[1.0, 2.0], [3.0]]
    elif kind == "scalar":
        feeds[target] = 1.5
    else:  # two inputs that share a symbol, at different sizes
        if not any(s.is_symbolic for s in specs) or len(specs) < 2:
            feeds[target] = x.astype(np.float64 if x.dtype != np.float64 else np.float32)
            return "wrong-dtype-fallback", feeds
        first = specs[1]
        feeds[first.name] = np.zeros((x.shape[0] + 1, *x.shape[1:]), x.dtype)
    return kind, feeds


def _accepted_malformed(kind):
    def check(outs):
        raise Wrong(f"accepted: {kind}")
    return check
