"""Optional Ed25519 signatures over an artifact's manifest.

The manifest lists the SHA-256 of every member, so a signature over ``manifest.json``'s exact
bytes covers the whole artifact. Signatures live in the member ``manifest.sig`` (JSON), which
the manifest does not list: signing adds or replaces one there without changing anything
else, and an artifact may carry several (one per key). ``deploy.load(path,
trusted_keys=[...])`` refuses an artifact that no trusted key signed.

Needs the ``cryptography`` package (``pip install 'deploy-compiler[sign]'``), imported here
only, and only when a key is used: loading without ``trusted_keys`` never imports it.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from ..errors import ArtifactError, DeployError, UsageError
from .artifact import SIGNATURES, read_artifact, write_zip

CONTEXT = b"deploy artifact manifest v2\n"  # signed before the manifest's bytes (no other use
#                                           of the key can produce the same message)
ALGORITHM = "ed25519"


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise DeployError("artifact signatures need the cryptography package: pip install "
                          "'deploy-compiler[sign]' (or 'cryptography>=41')") from None
    return InvalidSignature, serialization, ed25519


def fingerprint(public_key) -> str:
    """SHA-256 (hex) of the raw 32-byte public key: what ``manifest.sig`` and messages name."""
    _, serialization, _ = _crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def short(fp: str) -> str:
    return fp[:16]


def load_public_key(key):
    """An Ed25519 public key from a PEM file path (``-----BEGIN PUBLIC KEY-----``, as ``openssl
    pkey -pubout`` and ``deploy keygen`` write), an OpenSSH ``ssh-ed25519`` line, PEM/OpenSSH
    bytes, or an ``Ed25519PublicKey``."""
    _, serialization, ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    where = "a trusted key"
    if isinstance(key, (str, os.PathLike)):
        where = str(key)
        try:
            key = Path(key).read_bytes()
        except OSError as e:
            raise UsageError(f"trusted key {where}: cannot read it ({e.strerror})") from None
    if not isinstance(key, bytes):
        raise UsageError(f"trusted key {key!r}: expected a path to a public key file, its bytes "
                         "or an Ed25519PublicKey")
    try:
        loaded = (serialization.load_ssh_public_key(key.strip()) if key.startswith(b"ssh-")
                  else serialization.load_pem_public_key(key))
    except (ValueError, TypeError, IndexError) as e:
        hint = (" (that is a private key: pass its public key, `openssl pkey -in KEY.pem "
                "-pubout`)" if b"PRIVATE KEY" in key else "")
        raise UsageError(f"{where}: not an Ed25519 public key in PEM or OpenSSH form{hint} "
                         f"({e})") from None
    if not isinstance(loaded, ed25519.Ed25519PublicKey):
        raise UsageError(f"{where}: a {type(loaded).__name__}; artifact signatures are Ed25519")
    return loaded


def load_private_key(path):
    """An Ed25519 private key from an unencrypted PKCS#8 PEM file (``openssl genpkey
    -algorithm ed25519``, ``deploy keygen``)."""
    _, serialization, ed25519 = _crypto()
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"signing key {path}: cannot read it ({e.strerror})") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise UsageError(f"signing key {path} is encrypted; decrypt a copy for signing "
                         f"(openssl pkey -in {path} -out PLAIN.pem)") from None
    except ValueError as e:
        raise UsageError(f"signing key {path}: not a PEM private key ({e})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"signing key {path}: a {type(key).__name__}; artifact signatures are "
                         "Ed25519 (openssl genpkey -algorithm ed25519 -out KEY.pem)")
    return key


def sign_artifact(path, key_path, out=None) -> tuple[Path, str, int]:
    """Check the artifact (``read_artifact``), sign its manifest with the private key at
    ``key_path`` and write it to ``out`` (default: in place, atomically). Returns (path, the
    key's fingerprint, how many signatures the artifact now carries)."""
    key = load_private_key(key_path)
    contents = read_artifact(path)
    if contents.manifest["format_version"] < 2:
        raise ArtifactError(f"{path}: format version {contents.manifest['format_version']} "
                            "artifacts cannot be signed; recompile it with this deploy")
    fp = fingerprint(key.public_key())
    records = [r for r in _records(path, contents.signatures) if r.get("key") != fp]
    sig = key.sign(CONTEXT + contents.manifest_bytes)
    records.append({"algorithm": ALGORITHM, "key": fp,
                    "signature": base64.b64encode(sig).decode()})
    text = json.dumps({"signatures": records}, indent=1, sort_keys=True).encode()
    written = write_zip(out or path, contents.manifest_bytes, contents.members, text)
    return written, fp, len(records)


def verify_signatures(path, manifest_bytes: bytes, signatures: bytes | None,
                      trusted_keys) -> str:
    """The fingerprint of a trusted key whose signature over the manifest verifies; else an
    ArtifactError saying whether the artifact is unsigned, signed by untrusted keys only, or
    carries a trusted key's signature that does not match (changed after signing)."""
    if isinstance(trusted_keys, (str, bytes, os.PathLike)):  # one key, not a list of them
        trusted_keys = [trusted_keys]
    keys = {}
    for k in trusted_keys:
        pub = load_public_key(k)
        keys[fingerprint(pub)] = pub
    if not keys:
        raise UsageError("trusted_keys is empty: no artifact could be trusted (give at least "
                         "one public key, or leave trusted_keys out to skip signature checks)")
    trusted = ", ".join(short(fp) for fp in keys)
    if signatures is None:
        raise ArtifactError(f"{path}: not signed, and trusted_keys requires a signature by one "
                            f"of: {trusted}. Sign it: deploy sign {path} --key KEY.pem")
    invalid_signature, _, _ = _crypto()
    records = _records(path, signatures)
    bad = []
    for rec in records:
        pub = keys.get(rec.get("key"))
        if pub is None or rec.get("algorithm") != ALGORITHM:
            continue
        try:
            pub.verify(base64.b64decode(rec.get("signature", ""), validate=True),
                       CONTEXT + manifest_bytes)
            return rec["key"]
        except (invalid_signature, ValueError, TypeError):
            bad.append(short(rec["key"]))
    if bad:
        raise ArtifactError(f"{path}: the signature by trusted key {', '.join(bad)} does not "
                            "verify: the manifest was changed after signing")
    by = ", ".join(short(str(r.get("key"))) for r in records) or "no key"
    raise ArtifactError(f"{path}: signed by {by}; none of them is a trusted key ({trusted})")


def _records(path, signatures: bytes | None) -> list[dict]:
    if signatures is None:
        return []
    try:
        data = json.loads(signatures.decode("utf-8"))
        records = data["signatures"]
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise TypeError("signatures is not a list of objects")
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise ArtifactError(f"{path}: {SIGNATURES} is malformed ({e})") from None
    return records


def generate_key(private_path, public_path) -> str:
    """Write a new Ed25519 key pair: the private key as unencrypted PKCS#8 PEM (mode 0600; an
    existing file is never overwritten), the public key as PEM. Returns its fingerprint."""
    _, serialization, ed25519 = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UsageError(f"{private_path} exists; not overwriting a key") from None
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    Path(public_path).write_bytes(public)
    return fingerprint(key.public_key())
