"""The artifact's shape program: symbolic sizes bound from the inputs, checked, evaluated.

A symbolic dim in the manifest is ``{"sym": <prefix form>, "text": "2*seq"}``; the prefix form
is an int, a symbol name, or ``[op, args...]`` with op one of ``+ * // % max min`` (written by
``graph_ir/sym.py``; this module evaluates it without importing the compiler). ``ShapeProgram``
reads each symbol's value off the first input dim that is exactly that symbol, checks every
other dim, the declared ranges and the equalities found at compile time, and gives the values
in the order kernels receive them.
"""
from __future__ import annotations

from ..errors import InputError

_OPS = {
    "+": lambda xs: sum(xs),
    "*": lambda xs: _product(xs),
    "//": lambda xs: xs[0] // xs[1],
    "%": lambda xs: xs[0] % xs[1],
    "max": lambda xs: max(xs),
    "min": lambda xs: min(xs),
}


def _product(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def evaluate(expr, env: dict[str, int]) -> int:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, str):
        return env[expr]
    return _OPS[expr[0]]([evaluate(a, env) for a in expr[1:]])


def is_symbolic(dim) -> bool:
    return isinstance(dim, dict)


def dim_text(dim) -> str:
    return dim["text"] if is_symbolic(dim) else str(dim)


def shape_of(shape: list, env: dict[str, int]) -> tuple[int, ...]:
    return tuple(evaluate(d["sym"], env) if is_symbolic(d) else d for d in shape)


class ShapeProgram:
    """Binds and checks the symbols of one artifact (``manifest["symbols"]`` in kernel order,
    ``manifest["dims"]``: name -> [low, high or null], ``manifest["constraints"]``)."""

    def __init__(self, manifest: dict):
        self.symbols: list[str] = list(manifest.get("symbols", []))
        self.ranges = {k: tuple(v) for k, v in manifest.get("dims", {}).items()}
        self.constraints = [(a, b, where, _names(_expr(a)) | _names(_expr(b)))
                            for a, b, where in manifest.get("constraints", [])]
        self.inputs = [(s["name"], s["shape"]) for s in manifest["inputs"]]
        self.runtime = runtime_symbols(manifest)

    def uses_runtime(self, shape: list) -> bool:
        """Whether a value's shape is known only once a host op has run."""
        return any(_names(d["sym"]) & self.runtime for d in shape if is_symbolic(d))

    def bind_outputs(self, env: dict[str, int], shapes: list[tuple[list, tuple]],
                     where: str) -> None:
        """The symbols a host op's outputs define (``shapes``: (manifest shape, actual shape)
        per output) into ``env``; InputError where an output disagrees with the compiled
        shape or a constraint fails."""
        new = set()
        for spec, got in shapes:
            if len(spec) != len(got):
                raise InputError(f"{where}: output of rank {len(got)}, compiled for rank "
                                 f"{len(spec)}")
            for d, n in zip(spec, got):
                if is_symbolic(d) and isinstance(d["sym"], str) and d["sym"] not in env:
                    env[d["sym"]] = int(n)
                    new.add(d["sym"])
        for spec, got in shapes:
            want = shape_of(spec, env)
            if tuple(got) != want:
                text = ", ".join(dim_text(d) for d in spec)
                raise InputError(f"{where}: output of shape {list(got)}, but the artifact was "
                                 f"compiled for [{text}] = {list(want)}")
        self._check_constraints(env, new)

    def bind(self, shapes: list[tuple]) -> dict[str, int]:
        """Symbol values from the input shapes (in input order); InputError naming the symbol
        and the inputs when they disagree or leave a range."""
        env: dict[str, int] = {}
        seen: dict[str, str] = {}
        for (name, spec), got in zip(self.inputs, shapes):
            for k, d in enumerate(spec):
                if is_symbolic(d) and isinstance(d["sym"], str):
                    sym = d["sym"]
                    if sym in env and env[sym] != got[k]:
                        raise InputError(
                            f"{sym} must be equal in {seen[sym]} and {name}: got {env[sym]} "
                            f"and {got[k]}")
                    env.setdefault(sym, int(got[k]))
                    seen.setdefault(sym, name)
        missing = [s for s in self.symbols if s not in env and s not in self.runtime]
        if missing:
            raise InputError(f"the input shapes do not determine {', '.join(missing)}")
        self._check_ranges(env)
        self._check_dims(shapes, env)
        self._check_constraints(env)
        return env

    def _check_ranges(self, env) -> None:
        for sym, (lo, hi) in self.ranges.items():
            v = env.get(sym)
            if v is None:
                continue
            if v < lo or (hi is not None and v > hi):
                bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
                raise InputError(f"{sym}={v} is outside the compiled range {bound}")

    def _check_dims(self, shapes, env) -> None:
        for (name, spec), got in zip(self.inputs, shapes):
            want = shape_of(spec, env)
            if tuple(got) != want:
                text = ", ".join(dim_text(d) for d in spec)
                raise InputError(f"input '{name}': expected shape [{text}] = {list(want)} with "
                                 f"{_env_text(env)}, got {list(got)}")

    def _check_constraints(self, env, new: set | None = None) -> None:
        """Those whose symbols are all bound (``new``: only those involving these)."""
        for a, b, where, names in self.constraints:
            if (new is not None and not names & new) or not names <= env.keys():
                continue
            va, vb = evaluate(_expr(a), env), evaluate(_expr(b), env)
            if va != vb:
                raise InputError(f"{dim_text(a)} must equal {dim_text(b)} ({where}): got {va} "
                                 f"and {vb} with {_env_text(env)}")

    def values(self, env: dict[str, int]) -> tuple[int, ...]:
        """The symbols' values in kernel order (0 for those a host op has not bound yet)."""
        return tuple(env.get(s, 0) for s in self.symbols)


def _expr(dim):
    """A manifest dim's prefix form (a plain int stays an int)."""
    return dim["sym"] if is_symbolic(dim) else dim


def _names(expr) -> set[str]:
    """The symbol names of a prefix form."""
    if isinstance(expr, str):
        return {expr}
    if isinstance(expr, list):
        return set().union(*(_names(a) for a in expr[1:]))
    return set()


def runtime_symbols(manifest: dict) -> set[str]:
    """Symbols bound at run time from a host op's output (a dim that is exactly the symbol),
    not from the inputs: NonZero's count, the dims of an ``OnnxNode``'s output."""
    from_inputs = {d["sym"] for s in manifest["inputs"] for d in s["shape"]
                   if is_symbolic(d) and isinstance(d["sym"], str)}
    values = manifest.get("values", {})
    return {d["sym"] for step in manifest.get("steps", []) if step["kind"] == "host"
            for v in step["outputs"] for d in values[str(v)]["shape"]
            if is_symbolic(d) and isinstance(d["sym"], str) and d["sym"] not in from_inputs}


def _env_text(env: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in env.items())


def input_shapes(manifest: dict, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    """Concrete input shapes with the given symbol sizes (others: their range's low end, 1
    without a range), e.g. to make example inputs; ValueError for an unknown symbol."""
    symbols = manifest.get("symbols", [])
    unknown = sorted(set(sizes) - set(symbols))
    if unknown:
        raise InputError(f"unknown symbolic dim(s) {unknown}; this artifact's are "
                         f"{symbols or 'none (it has fixed shapes)'}")
    ranges = manifest.get("dims", {})
    env = {s: sizes.get(s, ranges.get(s, [1])[0]) for s in symbols}
    return [shape_of(s["shape"], env) for s in manifest["inputs"]]
