"""Lowerings: contractions as reductions of products."""
from __future__ import annotations

from ...graph_ir import ops
from ..expr import R, Reduce, cast
from ..kernel import compute, reduce_vars
from .registry import LowerCtx, lowering
from .elementwise import broadcast_index


@lowering(ops.contraction.MatMul)
def lower_matmul(ctx: LowerCtx):
    a, b = ctx.ins
    out = ctx.out
    a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
    k_extent = a.shape[-1]
    acc = out.dtype

    def body(*vs):
        ((k, _),) = rv = reduce_vars([k_extent], "k")
        full = list(vs)
        if b_vec:
            full = full + [None]
        if a_vec:
            full = full[:-2] + [None] + full[-1:] if len(full) >= 2 else [None] + full
        i, j = full[-2], full[-1]
        batch = full[:-2]
        a_idx = (k,) if a_vec else broadcast_index_batch(a, batch) + (i, k)
        b_idx = (k,) if b_vec else broadcast_index_batch(b, batch) + (k, j)
        return Reduce(R.SUM, rv, cast(a[a_idx], acc) * cast(b[b_idx], acc), acc)

    return [compute(out, body)]


def broadcast_index_batch(buf, batch_vars):
    """Index the batch dims (all but the last two) of ``buf`` against the output batch vars."""
    from ..kernel import Buffer
    head = Buffer(buf.name, buf.shape[:-2], buf.dtype)
    return broadcast_index(head, batch_vars) if head.shape else ()
