"""The ``.dpk`` artifact: one zip file holding ``manifest.json``, its digest ``manifest.sha256``,
binaries and weights (``.npy``, never pickle), and optionally ``manifest.sig`` (Ed25519
signatures over the manifest, ``runtime/signing.py``). The manifest records the format version,
the deploy that wrote it, the target, input/output specs, launch plan and the SHA-256 and size
of every member; ``read_artifact`` checks the container, the manifest and every member before
anything else reads them (docs/artifact.md, "What is checked at load"; docs/reliability.md).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
import stat
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, ResourceLimitError
from .dtypes import RAW, storage_dtype

FORMAT_VERSION = 2  # what write_artifact writes
READS = (1, 2)  # the format versions read_artifact accepts
MANIFEST = "manifest.json"
DIGEST = "manifest.sha256"  # the SHA-256 (hex) of manifest.json's bytes (version 2)
SIGNATURES = "manifest.sig"  # optional Ed25519 signatures over manifest.json (version 2)
# member names: slash-separated parts of these characters, no part "." or ".."
NAME = re.compile(r"[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*")
VERSION = re.compile(r"\d+(\.\d+)*([.+-]?[A-Za-z0-9.+-]*)?")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def deploy_version() -> str:
    """The version of the deploy package this runtime belongs to (the package root sets it
    before importing the runtime, which may not import the package root itself)."""
    return str(getattr(sys.modules.get(__name__.split(".")[0]), "__version__", "unknown"))


ALIGN = 64  # bytes: a cache line, one AVX-512 vector


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialized bytes starting on an ALIGN boundary (numpy guarantees 16).
    A size this process cannot allocate is a ResourceLimitError, not a MemoryError."""
    try:
        raw = np.empty(nbytes + ALIGN, np.uint8)
    except (MemoryError, ValueError) as e:  # (ValueError: more than numpy can address)
        raise ResourceLimitError(
            f"out of memory: a run needs a buffer of {nbytes} bytes ({nbytes / (1 << 30):.1f} "
            f"GiB), which this process cannot allocate ({type(e).__name__}); compile with "
            "--max-memory to refuse such a model at compile time, or use smaller inputs") from None
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


def aligned_array(shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    return aligned_empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize).view(dtype).reshape(shape)


def array_bytes(arr: np.ndarray) -> bytes:
    if arr.dtype.name in RAW:  # ml_dtypes' types: .npy has none of them, so store the bits
        arr = arr.view(RAW[arr.dtype.name])
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr).reshape(np.shape(arr)), allow_pickle=False)
    return buf.getvalue()


# ---- writing ------------------------------------------------------------------------------

def write_artifact(path, manifest: dict, members: dict[str, bytes]) -> Path:
    """Write the artifact atomically (a temporary file in the same folder, then renamed over
    ``path``: an interrupted save leaves the old file or none, never half of one)."""
    for name in members:
        check_name(name, "the compiler")
    manifest = dict(manifest, format_version=FORMAT_VERSION,
                    members={name: sha256(data) for name, data in sorted(members.items())},
                    member_bytes={name: len(data) for name, data in sorted(members.items())})
    manifest.setdefault("deploy_version", deploy_version())
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return write_zip(path, text, members)


def write_zip(path, manifest_bytes: bytes, members: dict[str, bytes],
              signatures: bytes | None = None) -> Path:
    """The container: manifest.json, its digest, the signatures if any, then the members in
    name order, all stored (uncompressed); written to a temporary file and renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
            z.writestr(MANIFEST, manifest_bytes)
            z.writestr(DIGEST, sha256(manifest_bytes) + "\n")
            if signatures is not None:
                z.writestr(SIGNATURES, signatures)
            for name, data in sorted(members.items()):
                z.writestr(name, data)
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no temporary file left behind
        tmp.unlink(missing_ok=True)
        raise
    return path


# ---- reading ------------------------------------------------------------------------------

@dataclass
class ArtifactContents:
    manifest: dict
    members: dict[str, bytes]  # every member but manifest.json, its digest and signatures
    manifest_bytes: bytes = b""  # manifest.json exactly as stored (what signatures sign)
    signatures: bytes | None = None  # manifest.sig, when present
    signed_by: str | None = None  # the trusted key's fingerprint, when read with trusted_keys
    _arrays: dict = field(default_factory=dict, repr=False)

    def array(self, name: str) -> np.ndarray:
        """A weight array (read once; variants of one artifact share it)."""
        return self.arrays([name])[name]

    def arrays(self, names) -> dict[str, np.ndarray]:
        """Weight arrays by name; those not read yet are laid out in one block, each on a cache
        line (vector loads of weight panels must not straddle lines). One allocation of 4 MB
        or more is one numpy asks the kernel to back with 2 MB pages, so a call that streams
        the weights from memory walks one page-table entry per 2 MB rather than per 4 KB: QDQ
        BERT-base's int8 weights are 0.6-2.4 MB arrays, each under numpy's threshold alone
        (one Zen 4 thread: 2.3% less CPU time per call, docs/architecture.md)."""
        loaded = [(n, load_npy(self.members[n], n)) for n in dict.fromkeys(names)
                  if n not in self._arrays]
        starts, total = [], 0
        for _, arr in loaded:
            starts.append(total)
            total += -(-arr.nbytes // ALIGN) * ALIGN
        block = aligned_empty(total)
        for (name, arr), at in zip(loaded, starts):
            dtype = arr.dtype.newbyteorder("=")
            self._arrays[name] = block[at:at + arr.nbytes].view(dtype).reshape(arr.shape)
            self._arrays[name][...] = arr
        return {n: self._arrays[n] for n in names}


def read_artifact(path, trusted_keys=None) -> ArtifactContents:
    """Read and check an artifact; any problem is an ``ArtifactError`` naming the file and, where
    there is one, the member. ``trusted_keys`` (public keys: paths to PEM files, PEM bytes or
    ``Ed25519PublicKey`` objects): also require a valid signature by one of them."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such artifact" if not path.exists()
                            else f"{path}: not a file")
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as z:
            infos = check_container(path, z.infolist(), size)
            if MANIFEST not in infos:
                raise ArtifactError(f"{path}: not a deploy artifact (no {MANIFEST})")
            manifest_bytes = _read(path, z, infos[MANIFEST])
            manifest = parse_manifest(path, manifest_bytes)
            version = check_version(path, manifest)
            payload = _check_listing(path, manifest, infos, version)
            raw = {name: _read(path, z, infos[name]) for name in infos if name != MANIFEST}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
            NotImplementedError) as e:
        raise ArtifactError(f"{path}: not a deploy artifact ({type(e).__name__}: {e})") from None
    if version >= 2:
        check_digest(path, manifest_bytes, raw.pop(DIGEST))
    signatures = raw.pop(SIGNATURES, None)
    members = {name: raw[name] for name in payload}
    for name, digest in manifest["members"].items():
        if sha256(members[name]) != digest:
            raise ArtifactError(f"{path}: member {name} is corrupt (hash mismatch)")
    check_references(path, manifest, members)
    contents = ArtifactContents(manifest, members, manifest_bytes, signatures)
    if trusted_keys is not None:
        if version < 2:
            raise ArtifactError(f"{path}: format version {version} artifacts carry no "
                                "signatures; recompile it with this deploy and sign it "
                                "(`deploy sign`) to load it with trusted_keys")
        from .signing import verify_signatures
        contents.signed_by = verify_signatures(path, manifest_bytes, signatures, trusted_keys)
    return contents


def _read(path: Path, z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    try:
        data = z.read(info)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise ArtifactError(f"{path}: member {info.filename} is unreadable (truncated or "
                            f"corrupt: {e})") from None
    if len(data) != info.file_size:
        raise ArtifactError(f"{path}: member {info.filename} is truncated ({len(data)} of "
                            f"{info.file_size} bytes)")
    return data


def check_name(name: str, where) -> None:
    """Member names are relative paths of plain parts: no absolute path, no ``..``, no
    backslash, drive letter or control character (nothing that could point outside a folder
    if someone extracted the zip)."""
    parts = name.split("/")
    if not NAME.fullmatch(name) or any(p in (".", "..") for p in parts):
        raise ArtifactError(f"{where}: member name {name!r} is not allowed (member names are "
                            "relative paths of letters, digits and '_.+-', without '..' parts)")


def check_container(path: Path, infos: list[zipfile.ZipInfo], size: int) -> dict:
    """The zip's entries, before any is read: allowed names, no duplicates, regular files only
    (no symbolic links or folders), stored uncompressed and unencrypted (what write_zip
    writes: a compressed member could expand to any size), each one's data inside the file,
    and all of them together no larger than the file (no member overlaps another)."""
    seen: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.filename
        check_name(name, path)
        if name in seen:
            raise ArtifactError(f"{path}: member {name} appears twice (a zip with duplicate "
                                "names is ambiguous)")
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise ArtifactError(f"{path}: member {name} is a symbolic link (artifacts hold "
                                "regular files only)")
        if info.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # (0: not recorded)
            raise ArtifactError(f"{path}: member {name} is not a regular file (artifacts hold "
                                "regular files only)")
        if info.flag_bits & 0x1:
            raise ArtifactError(f"{path}: member {name} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ArtifactError(f"{path}: member {name} is compressed (method "
                                f"{info.compress_type}); deploy stores members uncompressed, "
                                "so a compressed one (a zip bomb, or a file deploy did not "
                                "write) is refused")
        if info.file_size != info.compress_size:
            raise ArtifactError(f"{path}: member {name} declares {info.file_size} bytes but "
                                f"stores {info.compress_size}")
        end = info.header_offset + 30 + len(name.encode()) + info.compress_size
        if end > size:
            raise ArtifactError(f"{path}: member {name} is truncated (its data would end at byte "
                                f"{end} of a {size}-byte file)")
        seen[name] = info
    total = sum(i.file_size for i in infos)
    if total > size:
        raise ArtifactError(f"{path}: its members declare {total} bytes in all, more than the "
                            f"{size}-byte file holds (overlapping members: a zip bomb?)")
    return seen


def parse_manifest(path: Path, data: bytes) -> dict:
    """manifest.json: a JSON object, UTF-8, no key given twice at any level."""
    def no_duplicates(pairs):
        obj = {}
        for k, v in pairs:
            if k in obj:
                raise ArtifactError(f"{path}: {MANIFEST} gives key {k!r} twice")
            obj[k] = v
        return obj

    try:
        manifest = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError, JSONDecodeError)
        raise ArtifactError(f"{path}: not a deploy artifact ({MANIFEST} is not JSON: "
                            f"{str(e)[:200]})") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: not a deploy artifact ({MANIFEST} is not a JSON object)")
    return manifest


def check_version(path: Path, manifest: dict) -> int:
    """``format_version`` must be one this runtime reads; a version 2 manifest also names the
    deploy that wrote it. The messages say which side to upgrade."""
    version, producer = manifest.get("format_version"), manifest.get("deploy_version")
    by = f", written by deploy {producer}" if isinstance(producer, str) else ""
    reads = " and ".join(map(str, READS))
    ours = deploy_version()
    if type(version) is not int or version not in READS:  # (bool is not an int here)
        if type(version) is int and version > FORMAT_VERSION:
            raise ArtifactError(f"{path}: artifact format version {version}{by}, is newer "
                                f"than this runtime reads (deploy {ours} reads versions "
                                f"{reads}): upgrade deploy where it runs, or recompile the "
                                f"model with deploy {ours}")
        raise ArtifactError(f"{path}: artifact format version {version!r}{by}; this runtime "
                            f"(deploy {ours}) reads versions {reads}. Recompile the model "
                            "with this deploy.")
    if version >= 2 and not (isinstance(producer, str) and VERSION.fullmatch(producer)):
        raise ArtifactError(f"{path}: the manifest's deploy_version is {producer!r}; a format "
                            f"version {version} artifact names the deploy that wrote it (e.g. "
                            f"\"{ours}\")")
    return version


def _check_listing(path: Path, manifest: dict, infos: dict, version: int) -> list[str]:
    """Every member but the control ones is listed in ``members`` with a SHA-256 and (version
    2) its size in ``member_bytes``; every listed one is present. Returns the listed names."""
    listed = manifest.get("members")
    if not isinstance(listed, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in listed.items()):
        raise ArtifactError(f"{path}: the manifest's members is not a table of member name -> "
                            "SHA-256 (64 hex digits)")
    control = {MANIFEST} | ({DIGEST, SIGNATURES} if version >= 2 else set())
    for name in sorted(listed):
        if name not in infos or name in control:
            raise ArtifactError(f"{path}: member {name} is missing")
    for name in sorted(infos):
        if name not in listed and name not in control:
            raise ArtifactError(f"{path}: member {name} is not listed in the manifest (a file "
                                "added after the compile)")
    if version >= 2:
        if DIGEST not in infos:
            raise ArtifactError(f"{path}: {DIGEST} is missing (a format version 2 artifact "
                                "carries its manifest's digest)")
        sizes = manifest.get("member_bytes")
        if not isinstance(sizes, dict):
            raise ArtifactError(f"{path}: the manifest has no member_bytes (each member's size)")
        for name in sorted(listed):
            if type(sizes.get(name)) is not int or sizes[name] != infos[name].file_size:
                raise ArtifactError(f"{path}: member {name} is {infos[name].file_size} bytes; "
                                    f"the manifest says {sizes.get(name)!r}")
    return sorted(listed)


def check_digest(path: Path, manifest_bytes: bytes, digest: bytes) -> None:
    if digest.strip() != sha256(manifest_bytes).encode():
        raise ArtifactError(f"{path}: {MANIFEST} is corrupt (its SHA-256 does not match "
                            f"{DIGEST})")


def check_references(path: Path, manifest: dict, members: dict[str, bytes]) -> None:
    """The members the manifest names (library, weights, GPU binaries) exist, and each weight's
    ``.npy`` header is whole and holds at least the bytes its value has in the plan (so no
    kernel reads past a weight that is smaller than the plan says)."""
    for m in (manifest, *_list(manifest.get("variants"))):
        if not isinstance(m, dict):
            raise ArtifactError(f"{path}: the manifest's variants are not objects")
        refs = [("library", m.get("library"))]
        refs += [(f"binaries[{k}]", b.get("name") if isinstance(b, dict) else b)
                 for k, b in enumerate(_list(m.get("binaries")))]
        constants = m.get("constants") or {}
        if not isinstance(constants, dict):
            raise ArtifactError(f"{path}: the manifest's constants is not a table")
        refs += [(f"constants[{k}]", v) for k, v in constants.items()]
        for key, name in refs:
            if name is not None and (not isinstance(name, str) or name not in members):
                raise ArtifactError(f"{path}: the manifest's {key} names member {name!r}, which "
                                    "the artifact does not have")
        values = m.get("values") or {}
        for vid, name in constants.items():
            spec = values.get(vid) if isinstance(values, dict) else None
            if isinstance(spec, dict):
                _check_weight(path, name, members[name], spec)


def _list(x) -> list:
    return x if isinstance(x, list) else []


def _check_weight(path: Path, name: str, data: bytes, spec: dict) -> None:
    """The array holds at least the bytes its value has in the plan (the layouts may differ:
    a scalar stored as one element, say); fewer would let a kernel read past its end."""
    try:
        arr_shape, arr_dtype = npy_header(data, name)
    except ArtifactError as e:
        raise ArtifactError(f"{path}: {e}") from None
    shape = spec.get("shape")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return  # (symbolic: the runtime's shape checks)
    try:
        want = storage_dtype(spec.get("dtype"))
    except TypeError:
        raise ArtifactError(f"{path}: member {name}: the manifest gives its value dtype "
                            f"{spec.get('dtype')!r}") from None
    need = int(np.prod(shape, dtype=np.int64)) * want.itemsize
    held = int(np.prod(arr_shape, dtype=np.int64)) * arr_dtype.itemsize
    if held < need:
        raise ArtifactError(f"{path}: member {name} holds {arr_dtype}{list(arr_shape)} ({held} "
                            f"bytes); the plan reads {need} bytes for it ({want}{shape})")


def npy_header(data: bytes, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a ``.npy`` member, checked against its length; no Python objects."""
    shape, _, dtype, _ = _npy(data, name)
    return shape, dtype


def load_npy(data: bytes, name: str) -> np.ndarray:
    """A ``.npy`` member as an array (read-only, no copy), never unpickling anything."""
    shape, fortran, dtype, offset = _npy(data, name)
    count = int(np.prod(shape, dtype=np.int64))
    arr = np.frombuffer(data, dtype, count=count, offset=offset)
    return arr.reshape(shape, order="F" if fortran else "C")


def _npy(data: bytes, name: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, Fortran order, dtype, data offset) from the header (numpy's parser, which reads
    a literal, never evaluates code), checked against the data's length."""
    buf = io.BytesIO(data)
    try:
        major, _ = np.lib.format.read_magic(buf)
        read = {1: np.lib.format.read_array_header_1_0, 2: np.lib.format.read_array_header_2_0}
        if major not in read:
            raise ValueError(f".npy format version {major}")
        shape, fortran, dtype = read[major](buf)
    except (ValueError, TypeError, SyntaxError) as e:
        raise ArtifactError(f"member {name} is not a readable .npy array ({e})") from None
    if dtype.hasobject:
        raise ArtifactError(f"member {name} holds Python objects (pickled data is refused)")
    count = 1
    for d in shape:
        count *= int(d)
    expected, held = count * dtype.itemsize, len(data) - buf.tell()
    if held != expected:
        raise ArtifactError(f"member {name} declares {dtype}{list(shape)} ({expected} bytes) "
                            f"but holds {held} bytes of data")
    return tuple(int(d) for d in shape), bool(fortran), dtype, buf.tell()
