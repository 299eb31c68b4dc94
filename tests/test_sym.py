"""Symbolic sizes: the algebra of ``graph_ir/sym.py`` (normal forms, simplification, decisions
from ranges, serialisation) and the runtime's evaluator of its prefix form
(``runtime/shapes.py``), which must agree with the compiler's on every expression."""
from __future__ import annotations

import json
import operator

import numpy as np
import pytest
from deploy.errors import DeployError, InputError
from deploy.graph_ir import sym
from deploy.graph_ir.sym import (
    Sym,
    SymbolicError,
    SymContext,
    bounds,
    dim_json,
    exact_div,
    floordiv,
    free_symbols,
    from_json,
    hint,
    mod,
    smax,
    smin,
    symbol_name,
    to_json,
    using,
)
from deploy.runtime import shapes as rt_shapes

s, b, t = Sym.symbol("s"), Sym.symbol("b"), Sym.symbol("t")


def ranges(**r):
    """A compile context with these symbol ranges (name=(low, high or None))."""
    return using(SymContext(ranges=dict(r)))


# ---- normal forms ------------------------------------------------------------------------------

def test_sums_and_products_have_one_normal_form():
    assert s + b == b + s and hash(s + b) == hash(b + s)
    assert (s + 1) * (s - 1) == s * s - 1
    assert (b + s) * 2 == 2 * s + b + b
    assert 3 * (s * b) == (b * 3) * s
    assert str(2 * s + 1) == "1 + 2*s"
    assert s != b and s + 1 != s


def test_a_result_without_symbols_is_a_plain_int():
    for x in (s - s, (s + 3) - s, 0 * s, (2 * s) - s - s + 7):
        assert type(x) is int
    assert s - s == 0 and (s + 3) - s == 3 and (2 * s) - s - s + 7 == 7
    assert (s * b) // (b * s) == 1 and type((s * b) // (b * s)) is int


def test_numpy_integers_mix_with_syms():
    assert s + np.int64(2) == s + 2
    assert np.int32(3) * s == 3 * s
    assert (4 * s) // np.int64(4) == s


# ---- division and modulo ------------------------------------------------------------------------

def test_floordiv_splits_off_divisible_terms():
    assert (16 * s + 32) // 16 == s + 2
    assert (16 * s + 35) // 16 == s + 2  # 35 // 16 == 2, and 16*s stays whole
    assert (4 * s + 8 * b + 3) // 4 == s + 2 * b
    assert (6 * s) // 3 == 2 * s


def test_exact_division_of_products():
    assert (b * s * 768) // (s * 12) == 64 * b
    assert exact_div(b * s * 768, s * 12) == 64 * b
    assert (b * s * 768) / (s * 12) == 64 * b
    assert exact_div(s + 1, s) is None
    assert exact_div(b * s * 10, s * 12) is None  # 10 / 12 is not an integer
    with pytest.raises(SymbolicError):
        (b * s * 10) / (s * 12)
    with pytest.raises(SymbolicError):
        (s + 1) / 2


def test_division_by_a_sum_it_is_a_multiple_of():
    x, y = s // 4, b // 4
    total = 16 + 16 * x + 16 * x * y + 16 * y  # 16 * (1 + x) * (1 + y), expanded
    assert exact_div(total, 1 + x + x * y + y) == 16
    assert exact_div(32 * b * x - 32 * b, 8 * b * x - 8 * b) == 4
    assert exact_div(total, 1 + x + y) is None
    assert exact_div(s * b + s, b + 1) == s
    assert exact_div(s * b + 1, b + 1) is None


def test_nested_floor_divisions_fold():
    assert ((s // 5) // 2) // 2 == s // 20
    assert (s // 3) // 4 == s // 12
    q = ((s - 7) // 2) // 3  # floor semantics hold for negative values too
    assert [sym.evaluate(q, {"s": v}) for v in range(1, 30)] == \
        [((v - 7) // 2) // 3 for v in range(1, 30)]


def test_a_window_that_must_fit_raises_the_low_end_of_the_range():
    ctx = SymContext(ranges={"h": (1, 100)})
    with using(ctx):
        # a stride-2 window of 3, then one of 2 (no padding)
        sym.require_at_least((((Sym.symbol("h") - 1) // 2 - 1) // 2) + 1, 1, "window")
        assert ctx.ranges["h"] == (3, 100)
        sym.require_at_least(Sym.symbol("h") - 2, 1, "window")  # a 3-tap window: h >= 3 holds
        assert ctx.ranges["h"] == (3, 100)
        sym.require_at_least(Sym.symbol("h") - 9, 1, "a window of 10")
        assert ctx.ranges["h"] == (10, 100)
        with pytest.raises(ValueError, match="needs h >= 200"):
            sym.require_at_least(Sym.symbol("h") - 199, 1, "a window of 200")
        sym.require_at_least(s - b, 1, "two symbols")  # several symbols: left alone
        assert "s" not in ctx.ranges and "b" not in ctx.ranges


def test_floordiv_that_does_not_simplify_stays_an_atom_and_evaluates_as_floor():
    q = (s + 1) // 2
    assert isinstance(q, Sym) and free_symbols(q) == {"s"}
    assert [sym.evaluate(q, {"s": v}) for v in (1, 2, 3, 4, 7)] == [1, 1, 2, 2, 4]
    r = s // b
    assert [sym.evaluate(r, {"s": v, "b": 3}) for v in (1, 3, 8)] == [0, 1, 2]


def test_mod_by_a_divisor_of_every_coefficient_is_zero():
    assert (6 * s + 4 * b) % 2 == 0
    assert (6 * s + 3) % 3 == 0
    assert (12 * s * b) % (4 * s) == 0
    assert (b * s * 768) % (s * 12) == 0
    assert (4 * s + 5) % 4 == 1  # the constant is all that is left
    m = (4 * s + 6 * b) % 4  # 6*b % 4 is not known
    assert isinstance(m, Sym)
    assert sym.evaluate(m, {"s": 5, "b": 3}) == (4 * 5 + 6 * 3) % 4


def test_mod_decided_by_a_range():
    with ranges(s=(1, 3)):
        assert s % 4 == s
        assert (s + 4) % 4 == s  # 4 is a multiple of 4, then s < 4
    with ranges(s=(1, 10)):
        assert isinstance(s % 4, Sym)


# ---- min, max and comparisons ------------------------------------------------------------------

def test_min_max_decided_without_ranges():
    assert smax(s, 1) == s and smin(s, 1) == 1  # every symbol is at least 1
    assert smax(s + 1, s) == s + 1 and smin(s + 1, s) == s
    assert smax(s, 0) == s and smin(s * b, 0) == 0
    m = smin(s, 512)  # no range: s may be larger than 512
    assert isinstance(m, Sym) and sym.evaluate(m, {"s": 600}) == 512
    assert smin(s, b) == smin(b, s)  # one normal form for either order


def test_min_max_decided_by_ranges():
    with ranges(s=(1, 64)):
        assert smin(s, 512) == s and smin(s, 64) == s
        assert smax(s, 100) == 100 and smax(s, 64) == 64
        undecided = smin(s, 32)
        assert isinstance(undecided, Sym)
        assert [sym.evaluate(undecided, {"s": v}) for v in (1, 32, 33, 64)] == [1, 32, 32, 32]
    with ranges(s=(8, 16), b=(20, None)):
        assert smax(s, b) == b and smin(s, b) == s
        assert smax(s, 7) == s and smin(s, 7) == 7


def test_comparisons_decided_or_raise():
    assert s >= 1 and s > 0 and s + 1 > s and not s < 1 and s * b >= 1
    assert 0 < s and s - 1 >= 0 and not (2 * s < s)
    for cmp in (operator.gt, operator.ge, operator.lt, operator.le):
        with pytest.raises(SymbolicError) as e:
            cmp(s, 2)
        assert e.value.symbols == ("s",)
    with pytest.raises(SymbolicError, match="depends on the sizes"):
        _ = s + b > 3
    with ranges(s=(1, 4)):
        assert s < 5 and s <= 4 and not s > 4
        with pytest.raises(SymbolicError):
            _ = s >= 2


def test_nothing_converts_a_sym_to_a_number_silently():
    with pytest.raises(SymbolicError, match="not known at compile time"):
        int(s)
    with pytest.raises(SymbolicError):
        range(s)
    with pytest.raises(SymbolicError):
        operator.index(2 * s)
    with pytest.raises(SymbolicError):
        [0, 1, 2][s]
    with pytest.raises(SymbolicError):
        bool(s - 1)  # zero when s == 1
    with pytest.raises(SymbolicError):
        abs(s - 3)
    assert bool(s) and abs(-s) == s and abs(s + 2) == s + 2


def test_symbolic_error_is_a_deploy_error_naming_its_symbols():
    with pytest.raises(SymbolicError) as e:
        int(b * s + t)
    assert isinstance(e.value, DeployError) and isinstance(e.value, ValueError)
    assert e.value.symbols == ("b", "s", "t")


# ---- bounds and hints --------------------------------------------------------------------------

def test_bounds_from_ranges():
    assert bounds(7) == (7, 7)
    assert bounds(2 * s + 3) == (5, None)
    assert bounds(-s) == (None, -1)
    with ranges(s=(1, 10), b=(2, 3)):
        assert bounds(2 * s + 3) == (5, 23)
        assert bounds(s * b) == (2, 30)
        assert bounds(smin(s, 4)) == (1, 4)
        assert bounds(s % 4) == (0, 3)
        lo, hi = bounds(s * b - s)  # interval arithmetic: may be wider, never narrower
        assert lo <= 1 and hi >= 20


def test_hints():
    assert hint(5) == 5
    assert hint(s) == sym.DEFAULT_HINT
    with ranges(s=(1, 64)):
        assert hint(s) == 64 and hint(2 * s + 1) == 129
    with ranges(s=(300, 512)):
        assert hint(s) == 300  # inside the range
    with using(SymContext(hints={"s": 5, "b": 3})):
        assert hint(s * b + s) == 20


def test_free_symbols_include_those_inside_atoms():
    assert free_symbols(3) == set()
    assert free_symbols(s + 2 * b) == {"s", "b"}
    assert free_symbols(smin(s, t) // 3 + 1) == {"s", "t"}


def test_symbol_names_are_identifiers():
    assert symbol_name("batch") == "batch"
    assert symbol_name("batch size") == "batch_size"
    assert symbol_name("sequence-length") == "sequence_length"
    assert symbol_name("1st") == "d1st"


# ---- serialisation -----------------------------------------------------------------------------

EXAMPLES = [7, s, 2 * s + 1, b * s * 64, s * s - 3 * b, (s + 1) // 2, (4 * s + 6 * b) % 4,
            smin(s, 512), smax(s * b, t + 3), smin(s, t) * 3 - 1, ((s + 1) // 2) * b + t % 5,
            -s, (b * s + 3) // (s + 1)]


@pytest.mark.parametrize("x", EXAMPLES, ids=str)
def test_json_round_trip(x):
    j = to_json(x)
    assert json.loads(json.dumps(j)) == j  # plain JSON
    back = from_json(json.loads(json.dumps(j)))
    assert back == x and type(back) is type(x)
    d = dim_json(x)
    if isinstance(x, Sym):
        assert d == {"sym": j, "text": str(x)}
    else:
        assert d == x


# ---- property: simplification is sound, and the runtime evaluates what the compiler meant ------

NAMES = ("a", "b", "c")
RANGES = {"a": (1, None), "b": (2, 9), "c": (1, 64)}  # a unbounded, b and c ranged


def _random_expr(rng, depth):
    """(Sym or int, reference function env -> int) built by the same operations."""
    if depth == 0 or rng.random() < 0.25:
        if rng.random() < 0.6:
            n = str(rng.choice(NAMES))
            return Sym.symbol(n), lambda env, n=n: env[n]
        k = int(rng.integers(-6, 40))
        return k, lambda env, k=k: k
    op = rng.choice(["+", "-", "*", "//", "%", "min", "max", "neg", "+", "*"])
    x, fx = _random_expr(rng, depth - 1)
    if op == "neg":
        return -x, lambda env: -fx(env)
    if op in ("//", "%"):  # divisors stay positive: a constant, a symbol, or a sum of them
        kind = rng.integers(3)
        if kind == 0:
            k = int(rng.integers(1, 17))
            y, fy = k, (lambda env, k=k: k)
        elif kind == 1:
            n = str(rng.choice(NAMES))
            k = int(rng.integers(1, 5))
            y, fy = k * Sym.symbol(n), (lambda env, n=n, k=k: k * env[n])
        else:
            n, k = str(rng.choice(NAMES)), int(rng.integers(0, 4))
            y, fy = Sym.symbol(n) + k, (lambda env, n=n, k=k: env[n] + k)
        if op == "//":
            return floordiv(x, y), lambda env: fx(env) // fy(env)
        return mod(x, y), lambda env: fx(env) % fy(env)
    y, fy = _random_expr(rng, depth - 1)
    fn = {"+": (operator.add, operator.add), "-": (operator.sub, operator.sub),
          "*": (operator.mul, operator.mul), "min": (smin, min), "max": (smax, max)}[op]
    return fn[0](x, y), lambda env: fn[1](fx(env), fy(env))


def _random_env(rng):
    env = {}
    for n in NAMES:
        lo, hi = RANGES[n]
        env[n] = int(rng.integers(lo, (hi if hi is not None else 300) + 1))
    return env


def test_random_expressions_simplify_soundly_and_evaluate_alike_at_run_time():
    """400 random expressions built under declared ranges; at random sizes inside the ranges, the
    simplified Sym, its JSON form through the runtime's evaluator, and the same operations on
    plain ints give one answer, and that answer lies within ``bounds``."""
    rng = np.random.default_rng(1234)
    symbolic = 0
    with ranges(**RANGES):
        for _ in range(400):
            x, ref = _random_expr(rng, int(rng.integers(1, 5)))
            j = json.loads(json.dumps(to_json(x)))
            back = from_json(j)
            assert back == x, f"{x}: from_json(to_json) gave {back}"
            lo, hi = bounds(x)
            symbolic += isinstance(x, Sym)
            for _ in range(6):
                env = _random_env(rng)
                want = ref(env)
                got = sym.evaluate(x, env)
                assert got == want, f"{x} at {env}: sym.evaluate {got}, by the ops {want}"
                assert rt_shapes.evaluate(j, env) == want, f"{x} at {env}: runtime {j}"
                assert lo is None or lo <= want, f"{x} at {env}: {want} below bound {lo}"
                assert hi is None or want <= hi, f"{x} at {env}: {want} above bound {hi}"
    assert symbolic > 250  # the generator mostly makes expressions that keep symbols


def test_random_expressions_without_ranges():
    """The same property with no declared ranges (every symbol only >= 1), large sizes too."""
    rng = np.random.default_rng(99)
    for _ in range(300):
        x, ref = _random_expr(rng, int(rng.integers(1, 5)))
        j = to_json(x)
        assert from_json(j) == x
        for _ in range(4):
            env = {n: int(rng.choice([1, 2, 3, int(rng.integers(1, 5000))])) for n in NAMES}
            want = ref(env)
            assert sym.evaluate(x, env) == want, f"{x} at {env}"
            assert rt_shapes.evaluate(j, env) == want, f"{x} at {env}"


# ---- the runtime's shape program on a hand-written manifest ------------------------------------

SEQ, N = Sym.symbol("seq"), Sym.symbol("n")
MANIFEST = {  # what compiler.py writes for inputs ids, mask: [batch, seq]; pairs: [n, 2*seq + 1, 4]
    "symbols": ["batch", "seq", "n"],
    "dims": {"batch": [1, None], "seq": [1, 16]},
    "constraints": [[dim_json(2 * SEQ), dim_json(N), "test equality"]],
    "inputs": [{"name": "ids", "dtype": "int64", "shape": [dim_json(Sym.symbol("batch")),
                                                        dim_json(SEQ)]},
               {"name": "mask", "dtype": "int64", "shape": [dim_json(Sym.symbol("batch")),
                                                         dim_json(SEQ)]},
               {"name": "pairs", "dtype": "float32", "shape": [dim_json(N), dim_json(2 * SEQ + 1),
                                                            4]}],
}


def test_shape_program_binds_and_checks():
    prog = rt_shapes.ShapeProgram(MANIFEST)
    env = prog.bind([(2, 7), (2, 7), (14, 15, 4)])
    assert env == {"batch": 2, "seq": 7, "n": 14}
    assert prog.values(env) == (2, 7, 14)
    with pytest.raises(InputError, match=r"seq must be equal in ids and mask: got 7 and 9"):
        prog.bind([(2, 7), (2, 9), (14, 15, 4)])
    with pytest.raises(InputError, match=r"seq=17 is outside the compiled range 1\.\.16"):
        prog.bind([(2, 17), (2, 17), (34, 35, 4)])
    with pytest.raises(InputError, match=r"input 'pairs': expected shape \[n, 1 \+ 2\*seq, 4\]"):
        prog.bind([(2, 7), (2, 7), (14, 16, 4)])
    with pytest.raises(InputError, match=r"2\*seq must equal n \(test equality\): got 14 and 12"):
        prog.bind([(2, 7), (2, 7), (12, 15, 4)])
    assert rt_shapes.input_shapes(MANIFEST, {"seq": 3, "n": 6}) == [(1, 3), (1, 3), (6, 7, 4)]
    with pytest.raises(InputError, match="unknown symbolic dim"):
        rt_shapes.input_shapes(MANIFEST, {"len": 3})


def test_text_of_an_expression_evaluates_to_its_value():
    # generated Triton code uses str(): a // or % atom inside a product keeps its parentheses
    from deploy.graph_ir.sym import Sym, evaluate
    r, s = Sym.symbol("r"), Sym.symbol("s")
    exprs = [4 * ((r + 15) // 16), -((r + 15) // 16), 3 * ((r + 1) % 5) + s,
             r * ((s + 63) // 64), 2 * ((r * s + 127) // 128) * 9, (r + 15) // 16]
    for e in exprs:
        for rv, sv in [(1, 1), (40, 7), (129, 300)]:
            env = {"r": rv, "s": sv}
            assert eval(str(e), {}, dict(env)) == evaluate(e, env), str(e)


def test_size_max_stays_flat():
    # a bound over many buffers: term-by-term, exact on shared monomials, no nested max atoms
    from deploy.graph_ir.sym import Sym, evaluate, size_max
    b, s = Sym.symbol("b"), Sym.symbol("s")
    acc = 0
    for k in range(1, 40):
        acc = size_max(acc, (k % 7) * b * s * 768 + 256 * (k % 3) + (k % 5) * b * s * s)
    assert acc == 6 * 768 * b * s + 512 + 4 * b * s * s
    for env in ({"b": 1, "s": 1}, {"b": 3, "s": 70}):
        assert evaluate(acc, env) >= max(evaluate(x, env) for x in (6 * 768 * b * s, 512))
    assert size_max(3, 5) == 5
