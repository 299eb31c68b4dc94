"""Artifacts: the seed ``.dpk`` files with a byte flipped in a member or anywhere, truncated,
with members added, renamed (``../``, absolute), made symbolic links, compressed (zip bombs),
overlapping, libraries swapped between artifacts, and manifests edited (with and without the
digest recomputed; a signed artifact edited and rehashed, loaded with its trusted key).

An artifact is refused with an ArtifactError, or it loads and its outputs are bit-identical to
the untouched artifact's; a change inside a member's data (a library, a weight, the manifest)
must be refused. Loading and running go through ``deploy.load`` or the command line
(``deploy verify``, ``inspect``, ``run``)."""
from __future__ import annotations

import hashlib
import io
import json
import stat
import struct
import warnings
import zipfile
from pathlib import Path

import deploy
import numpy as np
from deploy.runtime.artifact import DIGEST, MANIFEST, SIGNATURES

from .judge import Result, Wrong, accepted, cli, compare, judge, random_feeds

UNSAFE_NAMES = ("../evil.so", "/abs/evil.so", "lib/../../evil", "C:/evil", "lib\\evil.so",
                "./lib/model.so", "lib//model.so", "", "lib/\x00.so", "lib/model.so/",
                "weights/..", "~/.bashrc")


def _pick(rng, seq):
    return seq[int(rng.integers(0, len(seq)))]


def entries(path: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(path) as z:
        return [(i, z.read(i)) for i in z.infolist()]


def write(out: Path, items, compress=None) -> Path:
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        warnings.simplefilter("ignore")  # "Duplicate name"
        for info, data in items:
            if compress is not None and info.filename == compress:
                info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return out


def data_span(blob: bytes, info: zipfile.ZipInfo) -> tuple[int, int]:
    """Where a member's data lies in the file (after its local header)."""
    name_len, extra_len = struct.unpack("<HH", blob[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    return start, start + info.compress_size


def rebuilt(good: Path, out: Path, manifest_edit=None, members=None, rehash=False,
            fix_digest=True, signatures=True) -> Path:
    """The good artifact with members replaced (None removes), the manifest edited, and the
    digest (``fix_digest``) and members' hashes and sizes (``rehash``) recomputed."""
    items = {i.filename: d for i, d in entries(good)}
    manifest = json.loads(items[MANIFEST])
    for name, data in (members or {}).items():
        if data is None:
            items.pop(name, None)
        else:
            items[name] = data
    if rehash:
        listed = [n for n in items if n not in (MANIFEST, DIGEST, SIGNATURES)]
        manifest["members"] = {n: hashlib.sha256(items[n]).hexdigest() for n in listed}
        manifest["member_bytes"] = {n: len(items[n]) for n in listed}
    if manifest_edit is not None:
        manifest_edit(manifest)
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    if manifest_edit is None and not rehash:
        text = items[MANIFEST]
    items[MANIFEST] = text
    if fix_digest:
        items[DIGEST] = (hashlib.sha256(text).hexdigest() + "\n").encode()
    if not signatures:
        items.pop(SIGNATURES, None)
    order = [MANIFEST, DIGEST, SIGNATURES]
    names = [n for n in order if n in items] + sorted(n for n in items if n not in order)
    return write(out, [(zipfile.ZipInfo(n, (2024, 1, 1, 0, 0, 0)), items[n]) for n in names])


# ---- mutations: each returns (label, path, must be refused) ----------------------------

def flip_member(rng, good, out, seeds):
    blob = bytearray(good.read_bytes())
    info = _pick(rng, entries(good))[0]
    start, end = data_span(bytes(blob), info)
    if end > start:
        blob[int(rng.integers(start, end))] ^= 1 << int(rng.integers(0, 8))
    out.write_bytes(bytes(blob))
    kind = info.filename.split("/")[0].replace(".", "-")
    # (a flip in the digest's trailing newline may leave the same digest: not a must)
    return f"flip-in-{kind}", out, info.filename != DIGEST


def flip_anywhere(rng, good, out, seeds):
    blob = bytearray(good.read_bytes())
    for _ in range(int(rng.integers(1, 4))):
        blob[int(rng.integers(0, len(blob)))] = int(rng.integers(0, 256))
    out.write_bytes(bytes(blob))
    return "flip-anywhere", out, False


def truncate(rng, good, out, seeds):
    blob = good.read_bytes()
    out.write_bytes(blob[:int(rng.integers(0, len(blob)))])
    return "truncate", out, True


def extra_member(rng, good, out, seeds):
    items = entries(good)
    name = _pick(rng, ["extra.txt", "lib/other.so", "weights/99.npy", "manifest.json.bak",
                       "gpu/kernels.py"])
    items.insert(int(rng.integers(0, len(items) + 1)),
                 (zipfile.ZipInfo(name), bytes(rng.integers(0, 256, 64, dtype=np.uint8))))
    return "extra-member", write(out, items), True


def unsafe_name(rng, good, out, seeds):
    """A member renamed as stored in the zip's headers (zipfile would normalize some names
    when writing them): the name is patched into the bytes, same length as a placeholder."""
    items = entries(good)
    k = int(rng.integers(0, len(items)))
    bad = _pick(rng, UNSAFE_NAMES).encode() or b"///"
    placeholder = bytes(rng.integers(65, 91, len(bad), dtype=np.uint8))  # A-Z
    items[k] = (zipfile.ZipInfo(placeholder.decode()), items[k][1])
    blob = write(out, items).read_bytes()
    if blob.count(placeholder) != 2:  # (the local header and the central directory)
        return "unsafe-name-skipped", write(out, entries(good)), False
    out.write_bytes(blob.replace(placeholder, bad))
    return "unsafe-name", out, True


def symlink_member(rng, good, out, seeds):
    items = entries(good)
    k = int(rng.integers(0, len(items)))
    info, data = items[k]
    new = zipfile.ZipInfo(info.filename)
    new.external_attr = (stat.S_IFLNK | 0o777) << 16
    items[k] = (new, data)
    return "symlink-member", write(out, items), True


def zip_bomb(rng, good, out, seeds):
    items = entries(good)
    kind = _pick(rng, ["deflated", "bomb-member", "declared-size", "overlap"])
    if kind == "deflated":
        return "zip-deflated", write(out, items, compress=_pick(rng, items)[0].filename), True
    if kind == "bomb-member":  # 100 MB of zeros deflated to ~100 KB, listed nowhere
        info = zipfile.ZipInfo("weights/bomb.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zipfile.ZipFile(out, "w") as z:
            for i, d in items:
                z.writestr(i, d)
            with z.open(info, "w") as f:
                chunk = bytes(1 << 20)
                for _ in range(100):
                    f.write(chunk)
        return "zip-bomb-member", out, True
    write(out, items)
    blob = bytearray(out.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(blob))) as z:
        infos = z.infolist()
    eocd = bytes(blob).rfind(b"PK\x05\x06")
    cd_offset = struct.unpack("<I", blob[eocd + 16:eocd + 20])[0]
    if kind == "declared-size":  # central directory: a member says it is 2 GB
        k = int(rng.integers(0, len(infos)))
        pos = cd_offset
        for _ in range(k):
            n, e, c = struct.unpack("<HHH", blob[pos + 28:pos + 34])
            pos += 46 + n + e + c
        blob[pos + 24:pos + 28] = struct.pack("<I", 0x7FFFFFFF)
        blob[pos + 20:pos + 24] = struct.pack("<I", 0x7FFFFFFF)
        out.write_bytes(bytes(blob))
        return "zip-declared-size", out, True
    # overlap: every central entry's offset points at the first member's header
    pos = cd_offset
    for _ in infos:
        n, e, c = struct.unpack("<HHH", blob[pos + 28:pos + 34])
        blob[pos + 42:pos + 46] = struct.pack("<I", 0)
        pos += 46 + n + e + c
    out.write_bytes(bytes(blob))
    return "zip-overlap", out, True


def swap_library(rng, good, out, seeds):
    others = [n for n in seeds.index["artifacts"] if seeds.artifact(n) != good]
    other = {i.filename: d for i, d in entries(seeds.artifact(_pick(rng, others)))}
    lib = other.get("lib/model.so", b"\x7fELF")
    return "swap-library", rebuilt(good, out, members={"lib/model.so": lib}), True


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for k, v in enumerate(obj):
            yield from _leaves(v, (*path, k))
    yield path


def _edit_value(rng):
    def edit(m):
        path = _pick(rng, [p for p in _leaves(m) if p])
        parent = m
        for k in path[:-1]:
            parent = parent[k]
        old = parent[path[-1]]
        if isinstance(old, bool) or not isinstance(old, (int, float)):
            choices = [None, 0, "x", [], {}, True, False]
        else:
            choices = [old + 1, old - 1, -old, old * 1000, 0, 2 ** 40, "7", None]
        parent[path[-1]] = _pick(rng, [c for c in choices if c != old or type(c) is not type(old)])
    return edit


def edit_manifest(rng, good, out, seeds):
    """Edits without the digest recomputed: refused by the digest."""
    return "manifest-edit", rebuilt(good, out, manifest_edit=_edit_value(rng), fix_digest=False), True


def edit_signed(rng, good, out, seeds):
    """The signed artifact edited, every hash and the digest recomputed: only the trusted
    key's signature can tell, and must (loaded with trusted_keys)."""
    signed = Path(seeds.index["signed"]["artifact"])
    kind = _pick(rng, ["value", "swap-library", "weight"])
    if kind == "value":
        path = rebuilt(signed, out, manifest_edit=_edit_value(rng), rehash=True)
    elif kind == "weight":
        items = {i.filename: d for i, d in entries(signed)}
        name = _pick(rng, sorted(n for n in items if n.startswith("weights/")))
        blob = bytearray(items[name])
        blob[-1] ^= 0x40
        path = rebuilt(signed, out, members={name: bytes(blob)}, rehash=True)
    else:
        other = {i.filename: d for i, d in entries(seeds.artifact("convnet"))}
        path = rebuilt(signed, out, members={"lib/model.so": other["lib/model.so"]}, rehash=True)
    return f"signed-rehashed-{kind}", path, True


MUTATIONS = [flip_member, flip_member, flip_anywhere, truncate, extra_member, unsafe_name,
             symlink_member, zip_bomb, swap_library, edit_manifest, edit_signed]


def case(rng: np.random.Generator, seeds, tmp: Path) -> tuple[str, Result]:
    mutation = _pick(rng, MUTATIONS)
    if mutation is edit_signed and "signed" not in seeds.index:
        mutation = edit_manifest
    name = "mlp" if mutation is edit_signed else _pick(rng, sorted(seeds.index["artifacts"]))
    good = seeds.artifact(name)
    label, path, refuse = mutation(rng, good, tmp / "m.dpk", seeds)
    keys = [seeds.index["signed"]["public"]] if mutation is edit_signed else None
    roll = rng.random()
    if roll < 0.15:
        command = _pick(rng, ["verify", "inspect", "run"])
        argv = [command, str(path)] + (["--trusted-key", keys[0]] if keys and command == "verify"
                                       else [])
        if keys and command != "verify":
            argv = ["verify", str(path), "--trusted-key", keys[0]]
        result = cli(argv)
        if result.outcome == "correct":
            result = judge(lambda: deploy.load(path, trusted_keys=keys),
                           lambda mod: _same_outputs(mod, seeds, name, label, refuse))
        return f"cli-{label}", result
    return label, judge(lambda: deploy.load(path, trusted_keys=keys),
                        lambda mod: _same_outputs(mod, seeds, name, label, refuse))


def _same_outputs(mod, seeds, name: str, label: str, refuse: bool) -> None:
    if refuse:
        raise Wrong(f"accepted: {label} ({name}.dpk)")
    feeds = random_feeds(seeds.modules[name].input_specs, np.random.default_rng(0))
    want = seeds.modules[name].run(feeds)
    compare(mod.run(feeds), want, rtol=0)
    if any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(mod.run(feeds), want)):
        raise Wrong(f"{label}: outputs differ from the untouched artifact's")


__all__ = ["accepted", "case"]
