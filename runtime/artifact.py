"""The ``.dpk`` artifact: one zip file holding ``manifest.json``, binaries and weights (``.npy``,
never pickle). The manifest records the format version, target, input/output specs, launch plan
and the SHA-256 of every member; ``read_artifact`` checks them all."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ArtifactError
from .dtypes import RAW

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


ALIGN = 64  # bytes: a cache line, one AVX-512 vector


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialized bytes starting on an ALIGN boundary (numpy guarantees 16)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
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


def write_artifact(path, manifest: dict, members: dict[str, bytes]) -> Path:
    path = Path(path)
    manifest = dict(manifest, format_version=FORMAT_VERSION,
                    members={name: sha256(data) for name, data in sorted(members.items())})
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        for name, data in sorted(members.items()):
            z.writestr(name, data)
    return path


@dataclass
class ArtifactContents:
    manifest: dict
    members: dict[str, bytes]

    def array(self, name: str) -> np.ndarray:
        """A weight array (read once; variants of one artifact share it)."""
        cache = self.__dict__.setdefault("_arrays", {})
        if name not in cache:
            arr = np.load(io.BytesIO(self.members[name]), allow_pickle=False)
            aligned = aligned_array(arr.shape, arr.dtype)
            aligned[...] = arr  # vector loads of weight panels must not straddle cache lines
            cache[name] = aligned
        return cache[name]


def read_artifact(path) -> ArtifactContents:
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such artifact")
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read(MANIFEST))
            members = {n: z.read(n) for n in z.namelist() if n != MANIFEST}
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: not a deploy artifact ({e})") from None
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {version}; this runtime reads "
                            f"version {FORMAT_VERSION}. Recompile the model with this deploy.")
    expected = manifest.get("members", {})
    for name, digest in expected.items():
        if name not in members:
            raise ArtifactError(f"{path}: member {name} is missing")
        if sha256(members[name]) != digest:
            raise ArtifactError(f"{path}: member {name} is corrupt (hash mismatch)")
    return ArtifactContents(manifest, members)
