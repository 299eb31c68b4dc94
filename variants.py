"""Shape variants: one artifact holding the model compiled for several input shapes.

``deploy.compile(model, shapes=[{"x": (1, 3, 224, 224)}, {"x": (8, 3, 224, 224)}])`` (or, on the
command line, ``--shape x=1x3x224x224 --shape x=8x3x224x224``) compiles every variant, stores
each one's plan and library under ``vK/`` and their weights once (content-addressed), and the
runtime runs the variant whose input shapes match the arrays it is given. The artifact's input
specs name the dims that differ (``batch``), so the shapes it accepts are visible to the user.
This is explicit shape specialization, as XLA does per shape; kernels are not shape-generic.
"""
from __future__ import annotations

import hashlib


def expand_shape_specs(shapes) -> list[dict] | None:
    """A list of shape dicts (variants), or None for a single compile."""
    if isinstance(shapes, (list, tuple)) and len(shapes) > 1 and all(isinstance(s, dict)
                                                                     for s in shapes):
        return [dict(s) for s in shapes]
    return None


def merge_variants(artifacts: list) -> tuple[dict, dict]:
    """(manifest, members) of one artifact holding every compiled variant."""
    members: dict[str, bytes] = {}
    variants = []
    for k, art in enumerate(artifacts):
        m = dict(art.manifest)
        renamed = {}
        for name, data in art.members.items():
            if name.startswith("weights/"):
                new = f"weights/{hashlib.sha256(data).hexdigest()[:20]}.npy"
            else:
                new = f"v{k}/{name}"
            renamed[name] = new
            members[new] = data
        m["constants"] = {vid: renamed[name] for vid, name in m["constants"].items()}
        if m.get("library"):
            m["library"] = renamed[m["library"]]
        m.pop("members", None)
        variants.append(m)
    top = dict(variants[0])
    top["inputs"] = _symbolic_specs([v["inputs"] for v in variants], variants)
    top["outputs"] = _symbolic_specs([v["outputs"] for v in variants], variants)
    top["variants"] = variants
    top["kernel_count"] = sum(v["kernel_count"] for v in variants)
    return top, members


def _symbolic_specs(spec_lists: list[list[dict]], variants: list[dict]) -> list[dict]:
    """Specs whose dims that differ between variants carry a name (the model's, if it had one)."""
    out = []
    for pos, spec in enumerate(spec_lists[0]):
        shape = []
        for axis, dim in enumerate(spec["shape"]):
            values = [specs[pos]["shape"][axis] for specs in spec_lists]
            shape.append(dim if len(set(values)) == 1 else _dim_name(spec["name"], axis, values,
                                                                     variants))
        out.append(dict(spec, shape=shape, variants=[specs[pos]["shape"] for specs in spec_lists]))
    return out


def _dim_name(name: str, axis: int, values: list[int], variants: list[dict]) -> str:
    bound = [v.get("provenance", {}).get("bound_dims", {}) for v in variants]
    for sym in bound[0]:
        if [b.get(sym) for b in bound] == values:
            return sym
    return f"{name}_dim{axis}"
