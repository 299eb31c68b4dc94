"""Attention recognition: a kernel's run of attention stages -> one ``AttentionStage``.

The fusion pass makes attention one kernel (``QK^T -> scale/mask -> Softmax -> @V -> layout``).
Lowered, its stages are (``o`` the batch/head variables, ``i`` queries, ``j`` keys, ``d`` the
head dimension, ``f`` the logits expression: scale, additive masks, ``where``-masks)::

    T[o,i,j] = sum_d q(o,i,d) * k(o,j,d)            (any epilogue folds into f)
    m[o,i,0] = max_j f(T[o,i,j])
    e[o,i,j] = exp(f(T[o,i,j]) - m[o,i,0])
    r[o,i,0] = 1 / sum_j e[o,i,j]
    p[o,i,j] = e[o,i,j] * r[o,i,0]                 (p may be e, written in place)
    O[o,i,c] = epi(sum_j p[o,i,j] * v(o,j,c))
    out[w]   = g(O[perm(w)])                        (optional: the layout back to the model's)

(elementwise stages may already be inlined into their readers, as in half-precision graphs:
they are inlined here too before comparing). ``fuse_attention`` recognises exactly this on a
kernel's stages and replaces the run by one ``AttentionStage``; anything else, or any
intermediate read outside the run, leaves the kernel as it was (the generic schedules then run
it). ``q``, ``k``, ``v`` and ``f`` stay tensor-IR expressions in canonical variables, rendered
by each backend's template (``backends/triton/attention.py``, ``backends/c/attention.py``), so
folded transposes, reshapes and the split of a fused QKV projection need no special case.
When every other input of ``f`` is a compile-time constant and its masked entries (logits far
below every kept one, whose exp is exactly 0) are exactly ``j > i + off`` (a causal mask,
however the export wrote it), the spec records that offset: templates may skip key blocks
past the diagonal.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..graph_ir.types import DType
from .expr import (
    INDEX,
    B,
    Binary,
    Cast,
    Const,
    Expr,
    Load,
    R,
    Reduce,
    Select,
    U,
    Unary,
    Var,
    substitute,
    transform,
    walk,
)
from .kernel import Kernel, Stage

MASKED, KEPT = -3e4, -2e4  # logit bounds of masked and kept entries (causal analysis)
HALF = (DType.float16, DType.bfloat16)
QK = Var("_qk", DType.float32)
ACC = Var("_o", DType.float32)


# ---- the spec of one recognised attention ------------------------------------------------------

@dataclass(frozen=True)
class AttentionSpec:
    outer: tuple[tuple[Var, int], ...]  # batch/head variables (one program row each)
    sq: int
    sk: int
    dk: int
    dv: int
    q: Expr  # in (outer, QI, QD)
    k: Expr  # in (outer, KJ, KD)
    v: Expr  # in (outer, VJ, VC)
    logits: Expr  # in (outer, LI, LJ, QK)
    value: Expr  # the stored value, in (outer, OI, OC, ACC)
    out_index: tuple[Expr, ...]  # index into the output buffer, in (outer, OI, OC)
    half: DType | None  # q, k, v half loads of one type: tensor-core dots in that type
    causal_offset: int | None  # masked iff j > i + offset (blocks past it skipped)


QI, QD = Var("_qi"), Var("_qd")
KJ, KD = Var("_kj"), Var("_kd")
VJ, VC = Var("_vj"), Var("_vc")
LI, LJ = Var("_li"), Var("_lj")
OI, OC = Var("_oi"), Var("_oc")


@dataclass(frozen=True)
class AttentionStage(Stage):
    """A run of stages replaced by one fused attention (``out``/``vars``/``extents``/``body``
    are those of the last stage it replaces)."""
    spec: AttentionSpec | None = field(default=None, compare=False)


def fuse_attention(kernel: Kernel, constants: dict[str, np.ndarray] | None = None) -> Kernel:
    """Replace every recognised attention run of ``kernel``'s stages by one ``AttentionStage``
    (``constants``: kernel input name -> value, for the causal-mask analysis)."""
    stages = list(kernel.stages)
    changed = False
    k = 0
    while k < len(stages):
        found = _match_at(kernel, stages, k, constants or {})
        if found is not None:
            stage, n = found
            stages[k:k + n] = [stage]
            changed = True
        k += 1
    if not changed:
        return kernel
    used = {s.out for s in stages} | {x.buf for s in stages for x in _reads(s)}
    temps = [t for t in kernel.temps if t.name in used]
    return Kernel(kernel.name, kernel.inputs, kernel.outputs, temps, stages, kernel.note,
                  kernel.aliases)


def _reads(s: Stage):
    if isinstance(s, AttentionStage):
        sp = s.spec
        exprs = [sp.q, sp.k, sp.v, sp.logits, sp.value, *sp.out_index]
    else:
        exprs = [s.body, *(s.store_index or ())]
    for e in exprs:
        for x in walk(e):
            if isinstance(x, Load):
                yield x


class _NoMatch(Exception):
    pass


def _need(cond: bool) -> None:
    if not cond:
        raise _NoMatch


def _match_at(kernel: Kernel, stages: list[Stage], k: int, constants: dict):
    try:
        return _match(kernel, stages, k, constants)
    except _NoMatch:
        return None


def _vars_in(e: Expr) -> set:
    return {x for x in walk(e) if isinstance(x, Var)}


def _plain(s: Stage) -> bool:
    return type(s) is Stage and s.store_index is None and s.accumulate is None


def _point(index, vars_, extents) -> bool:
    """``index`` is ``vars_`` (size-1 dimensions may be indexed by 0)."""
    return len(index) == len(vars_) and all(
        ix == v or (n == 1 and isinstance(ix, Const) and ix.value == 0)
        for ix, v, n in zip(index, vars_, extents))


def _match(kernel: Kernel, stages: list[Stage], k: int, constants: dict):
    s_qk = stages[k]
    _need(_plain(s_qk) and len(s_qk.extents) >= 2)
    temps = {t.name for t in kernel.temps}
    ext = tuple(s_qk.extents)
    nout = len(ext) - 2
    sq, sk = ext[-2], ext[-1]
    outer = tuple((Var(f"_b{n}"), ext[n]) for n in range(nout))
    # size-1 dimensions are indexed by 0 or by their variable: canonically by 0
    ovars = tuple(Const(0, INDEX) if n == 1 else v for v, n in outer)
    rowext = ext[:-1] + (1,)
    qk_red, q, kk, dk = _scores(s_qk, ovars)
    t = s_qk.out

    # the softmax: elementwise stages are inlined into their readers (in order, so an in-place
    # ``e = e * r`` reads the ``e`` before it); the row max, the reciprocal row sum, then p @ v
    defs: dict[str, tuple] = {}
    f = m_buf = r_buf = None
    j = k + 1
    while True:
        _need(j < len(stages) and j - k <= 8 and _plain(stages[j]))
        st = stages[j]
        body = _resolve(st.body, defs)
        has_red = any(isinstance(x, Reduce) for x in walk(body))
        if not has_red:
            _need(tuple(st.extents) == ext and st.out in temps)
            defs[st.out] = (st.vars, body)
        elif f is None:
            _need(tuple(st.extents) == rowext)
            f, m_buf = _max_logits(st, body, ovars, sk), st.out
        elif r_buf is None:
            _need(tuple(st.extents) == rowext)
            _recip_sum(st, body, ovars, sk, f, m_buf)
            r_buf = st.out
        else:
            break
        j += 1
    s_pv = st
    dv, v, value_pv = _pv(s_pv, body, ovars, sk, f, m_buf, r_buf)
    _need(tuple(s_pv.extents) == ext[:-1] + (dv,))
    # the logits read T only at (o, i, j): T becomes the dot product
    _need(all(_point(x.index, (*ovars, LI, LJ), ext) for x in walk(f)
              if isinstance(x, Load) and x.buf == t))
    canon = {**dict(zip(s_qk.vars[:-2], ovars)), s_qk.vars[-2]: LI, s_qk.vars[-1]: LJ}
    red = substitute(qk_red, canon)
    score = transform(substitute(s_qk.body, canon), lambda e: QK if e == red else None)
    _need(QK in _vars_in(score) and not any(isinstance(x, Reduce) for x in walk(score)))
    logits = transform(f, lambda e: score if isinstance(e, Load) and e.buf == t else None)

    # an optional layout stage after O (when it reads O as expected), then the result's place
    o_buf, o_ext = s_pv.out, ext[:-1] + (dv,)
    end = j + 1
    value, out_buf, out_index = _output(None, o_buf, value_pv, ovars, o_ext)
    if end < len(stages) and _plain(stages[end]) and o_buf in temps:
        try:
            value, out_buf, out_index = _output(stages[end], o_buf, value_pv, ovars, o_ext)
            end += 1
        except _NoMatch:
            pass
    run = stages[k:end]
    inner = {t, m_buf, r_buf, *defs} | ({o_buf} if out_buf != o_buf else set())
    _need(inner <= temps and out_buf not in inner)
    _need(not any(base in inner or view.name in inner for view, base in kernel.aliases))
    shapes = {b.name: tuple(b.shape) for b in kernel.temps}
    _need(all(shapes[s.out] == tuple(s.extents) for s in run if s.out in inner))
    _need(all(sum(s.out == x for s in run) == 1 for x in (t, m_buf, r_buf, o_buf)))
    # nothing outside the run touches its intermediates
    for n, s in enumerate(stages):
        if not k <= n < end:
            _need(s.out not in inner and not any(x.buf in inner for x in _reads(s)))
    for e in (q, kk, v, logits, value, *out_index):
        _need(not any(isinstance(x, Load) and x.buf in inner | {out_buf} for x in walk(e)))
        _need(not any(isinstance(x, Reduce) for x in walk(e)))
    half = _half_type(q, kk, v)
    if half is not None:
        q, kk, v = q.x, kk.x, v.x
    spec = AttentionSpec(outer, sq, sk, dk, dv, q, kk, v, logits, value, out_index, half, None)
    spec = _with_causal(spec, constants, kernel)
    last = run[-1]
    return AttentionStage(out_buf, last.vars, last.extents, last.body, None, None, spec), len(run)


def _resolve(e: Expr, defs: dict) -> Expr:
    """``e`` with loads of the run's elementwise intermediates replaced by their definitions."""
    def fn(x):
        if isinstance(x, Load) and x.buf in defs:
            vars_, body = defs[x.buf]
            return substitute(body, dict(zip(vars_, x.index)))
        return None
    return transform(e, fn)


def _scores(st: Stage, ovars) -> tuple[Reduce, Expr, Expr, int]:
    """``T[o,i,j] = epi(sum_d a*b)``: the reduction, q in (o, QI, QD), k in (o, KJ, KD), D."""
    reds = {x for x in walk(st.body) if isinstance(x, Reduce)}
    _need(len(reds) == 1)
    red = next(iter(reds))
    _need(red.op is R.SUM and red.dtype is DType.float32 and len(red.vars) == 1)
    _need(isinstance(red.body, Binary) and red.body.op is B.MUL)
    (d, dk), = red.vars
    i, j = st.vars[-2], st.vars[-1]
    a, b = red.body.a, red.body.b
    if j in _vars_in(a):
        a, b = b, a
    va, vb = _vars_in(a), _vars_in(b)
    _need(i in va and j not in va and j in vb and i not in vb)
    outer = dict(zip(st.vars[:-2], ovars))
    q = substitute(a, {**outer, i: QI, d: QD})
    kk = substitute(b, {**outer, j: KJ, d: KD})
    _need(_vars_in(q) <= {*ovars, QI, QD} and _vars_in(kk) <= {*ovars, KJ, KD})
    return red, q, kk, dk


def _row_canon(st: Stage, ovars, s: Var) -> dict:
    return {**dict(zip(st.vars[:-2], ovars)), st.vars[-2]: LI, s: LJ}


def _max_logits(st: Stage, body: Expr, ovars, sk: int) -> Expr:
    """``m[o,i,0] = max_j f``: f in (o, LI, LJ)."""
    _need(isinstance(body, Reduce) and body.op is R.MAX and len(body.vars) == 1)
    (s, n), = body.vars
    _need(n == sk and body.dtype is DType.float32)
    f = substitute(body.body, _row_canon(st, ovars, s))
    _need(_vars_in(f) <= {*ovars, LI, LJ})
    return f


def _exp_shift(e: Expr, f: Expr, m_buf: str, ovars) -> None:
    """``e`` is ``exp(f - m[o, i, 0])`` (canonical variables)."""
    _need(isinstance(e, Unary) and e.op is U.EXP)
    sub = e.x
    _need(isinstance(sub, Binary) and sub.op is B.SUB and sub.a == f)
    _need(isinstance(sub.b, Load) and sub.b.buf == m_buf)
    _need(_row_point(sub.b.index, ovars))


def _row_point(index, ovars) -> bool:
    """``index`` is (o, i, 0) (canonical variables: size-1 outer dimensions are 0)."""
    return tuple(index) == (*ovars, LI, Const(0, INDEX))


def _recip_sum(st: Stage, body: Expr, ovars, sk: int, f: Expr, m_buf: str) -> None:
    """``r[o,i,0] = 1 / sum_j exp(f - m)``."""
    _need(isinstance(body, Unary) and body.op is U.RECIP and isinstance(body.x, Reduce))
    red = body.x
    _need(red.op is R.SUM and len(red.vars) == 1 and red.vars[0][1] == sk)
    _exp_shift(substitute(red.body, _row_canon(st, ovars, red.vars[0][0])), f, m_buf, ovars)


def _pv(st: Stage, body: Expr, ovars, sk: int, f: Expr, m_buf: str, r_buf: str
        ) -> tuple[int, Expr, Expr]:
    """``O[o,i,c] = epi(sum_j p * v)`` with ``p = exp(f - m) * r`` (rounded through casts at
    most): Dv, v in (o, VJ, VC), epi in (o, OI, OC, ACC)."""
    reds = {x for x in walk(body) if isinstance(x, Reduce)}
    _need(len(reds) == 1)
    red = next(iter(reds))
    _need(red.op is R.SUM and red.dtype is DType.float32 and len(red.vars) == 1)
    (j, n), = red.vars
    _need(n == sk and isinstance(red.body, Binary) and red.body.op is B.MUL)
    i, c = st.vars[-2], st.vars[-1]
    a, b = red.body.a, red.body.b
    if not any(isinstance(x, Load) and x.buf == m_buf for x in walk(a)):
        a, b = b, a
    _is_p(substitute(a, _row_canon(st, ovars, j)), f, m_buf, r_buf, ovars)
    outer = dict(zip(st.vars[:-2], ovars))
    v = substitute(b, {**outer, j: VJ, c: VC})
    _need(_vars_in(v) <= {*ovars, VJ, VC})
    epi = transform(body, lambda e: ACC if e == red else None)
    epi = substitute(epi, {**outer, i: OI, c: OC})
    _need(_vars_in(epi) <= {*ovars, OI, OC, ACC})
    return st.extents[-1], v, epi


def _is_p(e: Expr, f: Expr, m_buf: str, r_buf: str, ovars) -> None:
    while isinstance(e, Cast) and e.dtype.is_float:
        e = e.x
    _need(isinstance(e, Binary) and e.op is B.MUL)
    x, y = (e.a, e.b) if isinstance(e.b, Load) else (e.b, e.a)
    _need(isinstance(y, Load) and y.buf == r_buf and _row_point(y.index, ovars))
    _exp_shift(x, f, m_buf, ovars)


def _output(st: Stage | None, o_buf: str, value: Expr, ovars, o_ext) -> tuple:
    """Where the attention's result goes: O itself, or ``out[w] = g(O[perm(w)])``."""
    canon = (*ovars, OI, OC)
    if st is None:
        return value, o_buf, canon
    loads = [x for x in walk(st.body) if isinstance(x, Load) and x.buf == o_buf]
    _need(len(set(loads)) == 1 and not any(isinstance(x, Reduce) for x in walk(st.body)))
    idx = loads[0].index
    _need(len(idx) == len(o_ext))
    extent = dict(zip(st.vars, st.extents))
    mapping = {}
    for ix, cv, n in zip(idx, canon, o_ext):
        if isinstance(ix, Const) and ix.value == 0 and n == 1:
            continue
        _need(isinstance(ix, Var) and extent.get(ix) == n and ix not in mapping)
        mapping[ix] = cv
    for w, n in zip(st.vars, st.extents):
        if w not in mapping:
            _need(n == 1)
            mapping[w] = Const(0, INDEX)
    # every O point is stored once: the out stage covers exactly O's non-trivial dimensions
    covered = {mapping[w] for w in st.vars if extent[w] != 1}
    _need(covered == {cv for cv, n in zip(canon, o_ext) if n != 1})
    body = transform(st.body, lambda e: value if isinstance(e, Load) and e.buf == o_buf else None)
    body = substitute(body, mapping)
    return body, st.out, tuple(mapping[w] for w in st.vars)


def _half_type(q: Expr, k: Expr, v: Expr) -> DType | None:
    types = set()
    for e in (q, k, v):
        if not (isinstance(e, Cast) and e.dtype is DType.float32 and isinstance(e.x, Load)
                and e.x.dtype in HALF):
            return None
        types.add(e.x.dtype)
    return types.pop() if len(types) == 1 else None


# ---- causal masks (static analysis of the logits) -----------------------------------------------

GRID_LIMIT = 1 << 24  # (outer x queries x keys) points evaluated at most


def _with_causal(spec: AttentionSpec, constants: dict, kernel: Kernel) -> AttentionSpec:
    masked = _masked(spec, constants, kernel)
    if masked is None:
        return spec
    off = _causal_offset(masked)
    if off is None:
        return spec
    return dataclasses.replace(spec, causal_offset=off)


def _masked(spec: AttentionSpec, constants: dict, kernel: Kernel) -> np.ndarray | None:
    """Per (outer..., i, j): whether the logit is masked. The logits are evaluated at scores
    -1e4, 0 and 1e4; an entry is masked when all three are <= -3e4 (a large negative bias, or a
    select of one), kept when all are >= -2e4. Any other entry, or a logit reading anything but
    constants, gives None. With scores within +-1e4 a masked logit then sits 1e4 below every
    kept one: its exp is exactly 0 whatever the row's maximum (fp16 masks clip at -65504)."""
    arrays = {b.name: np.asarray(constants[b.name]).reshape(b.shape)
              for b in kernel.inputs if b.name in constants}
    grid = _grid(spec, arrays)
    if grid is None:
        return None
    outer, sq, sk = grid
    if int(np.prod(outer, dtype=np.int64)) * sq * sk > GRID_LIMIT:
        return None
    rank = len(spec.outer) + 2
    env = {}
    for a, ((v, _), e) in enumerate(zip(spec.outer, outer)):
        env[v] = np.arange(e).reshape([e if k == a else 1 for k in range(rank)])
    env[LI] = np.arange(sq).reshape([1] * (rank - 2) + [sq, 1])
    env[LJ] = np.arange(sk).reshape([1] * (rank - 1) + [sk])
    values = []
    try:
        for score in (-1e4, 0.0, 1e4):
            env[QK] = np.float32(score)
            with np.errstate(all="ignore"):
                values.append(np.asarray(_eval(spec.logits, env, arrays), np.float64))
    except (_NoMatch, IndexError):
        return None
    hi, lo = np.maximum.reduce(values), np.minimum.reduce(values)
    masked, kept = hi <= MASKED, lo >= KEPT
    if not np.all(masked | kept):
        return None
    return np.broadcast_to(masked, (*outer, sq, sk))


SYMBOLIC_GRID = 256  # queries and keys a symbolic attention's mask is checked over (at least)


def _grid(spec: AttentionSpec, arrays: dict) -> tuple[list[int], int, int] | None:
    """(outer sizes, queries, keys) to evaluate the mask over: the real sizes, or where they are
    symbolic and the logits do not depend on any size (no size in the expression, affine index
    arithmetic, no symbolic outer variable read), a square grid covering every constant the
    logits read: the mask is then one function of (i, j) at every size, and a causal one found
    on the grid holds at each (the template still bounds keys by the real ``sk``)."""
    outer = [e for _, e in spec.outer]
    if all(isinstance(e, int) for e in (*outer, spec.sq, spec.sk)):
        return outer, spec.sq, spec.sk
    used = {x for x in walk(spec.logits) if isinstance(x, Var)}
    if any(not isinstance(e, int) and v in used for v, e in spec.outer):
        return None
    if any(_size_dependent(x) for x in walk(spec.logits)):
        return None
    side = max([SYMBOLIC_GRID, *(d for a in arrays.values() for d in a.shape[-2:])])
    return [e if isinstance(e, int) else 1 for e in outer], side, side


def _size_dependent(e: Expr) -> bool:
    """A size inside the expression, or index arithmetic that is not affine (a grid check of
    an affine mask holds beyond the grid; of ``(i * j) % m`` it need not)."""
    if isinstance(e, Const):
        return not isinstance(e.value, (int, float, bool, np.generic))
    if isinstance(e, Binary) and e.dtype is INDEX:
        if e.op in (B.MOD, B.FLOORDIV, B.DIV, B.MAX, B.MIN):
            return True
        return e.op is B.MUL and not (isinstance(e.a, Const) or isinstance(e.b, Const))
    return False


def _causal_offset(masked: np.ndarray) -> int | None:
    """``off`` when ``masked`` is exactly ``j > i + off`` with ``0 <= off < sk - 1`` (every row
    keeps a key, some keys are masked)."""
    sq, sk = masked.shape[-2:]
    off = int((~masked.reshape(-1, sk)[0]).sum()) - 1
    if not 0 <= off < sk - 1:
        return None
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    want = np.broadcast_to(j > i + off, masked.shape)
    return off if np.array_equal(masked, want) else None


_NP_BINARY = {
    B.ADD: np.add, B.SUB: np.subtract, B.MUL: np.multiply, B.MAX: np.maximum,
    B.MIN: np.minimum, B.LT: np.less, B.LE: np.less_equal, B.GT: np.greater,
    B.GE: np.greater_equal, B.EQ: np.equal, B.NE: np.not_equal, B.AND: np.logical_and,
    B.OR: np.logical_or,
}
_NP_UNARY = {U.NEG: np.negative, U.ABS: np.abs, U.EXP: np.exp, U.NOT: np.logical_not}


def _eval(e: Expr, env: dict, arrays: dict):
    """numpy value of an index/float expression over broadcast variable grids."""
    if isinstance(e, Var):
        _need(e in env)
        return env[e]
    if isinstance(e, Const):
        return e.value if e.dtype is INDEX else np.asarray(e.value, e.dtype.np)
    if isinstance(e, Load):
        _need(e.buf in arrays)
        arr = arrays[e.buf]
        if not e.index:
            return arr[()]
        return arr[tuple(np.asarray(_eval(i, env, arrays), np.int64) for i in e.index)]
    if isinstance(e, Binary):
        a, b = _eval(e.a, env, arrays), _eval(e.b, env, arrays)
        if e.op is B.DIV:
            return np.asarray(a) // b if e.dtype is INDEX or e.dtype.is_int else np.divide(a, b)
        if e.op is B.FLOORDIV:
            return np.floor_divide(a, b)
        if e.op is B.MOD and (e.dtype is INDEX or e.dtype.is_int):
            return np.mod(a, b)  # indices are non-negative: C and Python agree
        _need(e.op in _NP_BINARY)
        return _NP_BINARY[e.op](a, b)
    if isinstance(e, Unary):
        _need(e.op in _NP_UNARY)
        return _NP_UNARY[e.op](_eval(e.x, env, arrays))
    if isinstance(e, Select):
        return np.where(_eval(e.cond, env, arrays), _eval(e.a, env, arrays),
                        _eval(e.b, env, arrays))
    if isinstance(e, Cast):
        x = np.asarray(_eval(e.x, env, arrays))
        return x.astype(np.float32) if e.dtype in HALF else x.astype(e.dtype.np)
    raise _NoMatch


# ---- the template -----------------------------------------------------------------------------
