"""Artifact integrity (issue 19 item 2): every way of tampering with a ``.dpk`` file is refused at
load with an ``ArtifactError`` naming the member; format versions 1 and 2 are read; optional
Ed25519 signatures (docs/reliability.md). Each tampered file is rebuilt from a good one."""
from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import stat
import struct
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import deploy
import numpy as np
import pytest
from deploy.cli import main
from deploy.errors import ArtifactError, UsageError
from deploy.runtime.artifact import DIGEST, MANIFEST, SIGNATURES, read_artifact
from onnx import helper

from tests.util import make_model

X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5


def _model():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return make_model(nodes, [("x", np.float32, [3, 4])], [("y", np.float32, [3, 5])],
                      initializers={"w": rng.standard_normal((4, 5)).astype(np.float32)})


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = deploy.compile(_model()).save(tmp_path_factory.mktemp("good") / "m.dpk")
    names = zipfile.ZipFile(path).namelist()
    assert names[:2] == [MANIFEST, DIGEST] and "lib/model.so" in names
    assert any(n.startswith("weights/") for n in names)  # the cases below need both kinds
    return path


def entries(path: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(path) as z:
        return [(i, z.read(i)) for i in z.infolist()]


def contents_of(path: Path) -> dict[str, bytes]:
    return {i.filename: d for i, d in entries(path)}


def rebuild(path: Path, out: Path, items) -> Path:
    """Write ``items`` ((name or ZipInfo, bytes) pairs) as a zip, as they are."""
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        warnings.simplefilter("ignore")  # "Duplicate name"
        for info, data in items:
            z.writestr(info, data)
    return out


def edited(good: Path, out: Path, edit_manifest=None, members=None, fix_digest=True,
           rehash=False) -> Path:
    """The good artifact with its manifest edited (``edit_manifest(dict)``), members replaced
    (name -> bytes, None removes), the digest recomputed and (``rehash``) the members' hashes
    and sizes too: what someone who knows the format would do."""
    items = contents_of(good)
    manifest = json.loads(items[MANIFEST])
    for name, data in (members or {}).items():
        if data is None:
            items.pop(name)
        else:
            items[name] = data
    if rehash:
        listed = [n for n in items if n not in (MANIFEST, DIGEST, SIGNATURES)]
        manifest["members"] = {n: hashlib.sha256(items[n]).hexdigest() for n in listed}
        manifest["member_bytes"] = {n: len(items[n]) for n in listed}
    if edit_manifest:
        edit_manifest(manifest)
    if edit_manifest or rehash:
        items[MANIFEST] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    if fix_digest:
        items[DIGEST] = (hashlib.sha256(items[MANIFEST]).hexdigest() + "\n").encode()
    return rebuild(good, out, items.items())


def refused(path: Path, match: str) -> str:
    with pytest.raises(ArtifactError, match=match) as e:
        deploy.load(path)
    assert str(path) in str(e.value)
    return str(e.value)


def weight_name(good: Path) -> str:
    return next(n for n in zipfile.ZipFile(good).namelist() if n.startswith("weights/"))


def test_the_good_artifact_loads_and_runs(good):
    y = deploy.load(good).run({"x": X})[0]
    assert y.shape == (3, 5) and (y >= 0).all()
    m = read_artifact(good).manifest
    assert m["format_version"] == 2 and m["deploy_version"] == deploy.__version__
    assert set(m["member_bytes"]) == set(m["members"])


# ---- members ------------------------------------------------------------------------------

@pytest.mark.parametrize("member", ["lib/model.so", "weights"])
def test_a_changed_member_is_refused_by_its_hash(good, tmp_path, member):
    name = weight_name(good) if member == "weights" else member
    data = bytearray(contents_of(good)[name])
    data[len(data) // 2] ^= 0x01
    path = edited(good, tmp_path / "t.dpk", members={name: bytes(data)})
    refused(path, rf"member {name} is corrupt \(hash mismatch\)")


def test_a_flipped_byte_in_the_file_is_refused(good, tmp_path):
    """Bytes flipped in the file itself (the zip's CRC no longer matches either)."""
    raw = good.read_bytes()
    for name in ("lib/model.so", weight_name(good), MANIFEST):
        info = zipfile.ZipFile(good).getinfo(name)
        at = info.header_offset + 30 + len(name) + info.file_size // 2
        data = bytearray(raw)
        data[at] ^= 0x40
        path = tmp_path / f"flip-{name.replace('/', '_')}.dpk"
        path.write_bytes(bytes(data))
        refused(path, rf"member {name} is unreadable|{name} is (corrupt|not JSON)")


def test_an_edited_manifest_is_refused_by_its_digest(good, tmp_path):
    path = edited(good, tmp_path / "t.dpk",
                  edit_manifest=lambda m: m["inputs"][0].update(name="z"), fix_digest=False)
    refused(path, r"manifest.json is corrupt \(its SHA-256 does not match manifest.sha256\)")


def test_a_missing_manifest_digest_is_refused(good, tmp_path):
    path = edited(good, tmp_path / "t.dpk", members={DIGEST: None}, fix_digest=False)
    refused(path, r"manifest.sha256 is missing")


def test_an_extra_member_is_refused(good, tmp_path):
    items = [*entries(good), ("extra/readme.txt", b"hello")]
    refused(rebuild(good, tmp_path / "t.dpk", items),
            r"member extra/readme.txt is not listed in the manifest")


def test_a_missing_member_is_refused(good, tmp_path):
    path = edited(good, tmp_path / "t.dpk", members={"lib/model.so": None})
    refused(path, r"member lib/model.so is missing")


@pytest.mark.parametrize("name", ["../evil.so", "lib/../../evil.so", "/etc/passwd", "a\\b.so",
                                  "./lib/model.so", "lib//model.so", "C:/x.so"])
def test_unsafe_member_names_are_refused(good, tmp_path, name):
    items = [*entries(good), (name, b"x")]
    refused(rebuild(good, tmp_path / "t.dpk", items), re.escape(f"member name {name!r} is not "
                                                                 "allowed"))


def test_unsafe_names_as_stored_in_the_zip_are_refused(good, tmp_path):
    """The name patched in the file's bytes (local header and directory), whatever a zip
    writer would have made of it."""
    raw = rebuild(good, tmp_path / "a.dpk", [*entries(good), ("xetc/passwd", b"x")]).read_bytes()
    path = tmp_path / "t.dpk"
    path.write_bytes(raw.replace(b"xetc/passwd", b"/etc/passwd"))
    refused(path, r"member name '/etc/passwd' is not allowed")


def test_a_symlink_member_is_refused(good, tmp_path):
    link = zipfile.ZipInfo("lib/model.so")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    items = [(i, d) if i.filename != "lib/model.so" else (link, b"/usr/lib/libc.so.6")
             for i, d in entries(good)]
    refused(rebuild(good, tmp_path / "t.dpk", items), r"member lib/model.so is a symbolic link")


def test_a_folder_member_is_refused(good, tmp_path):
    items = [*entries(good), (zipfile.ZipInfo("lib/sub/"), b"")]
    refused(rebuild(good, tmp_path / "t.dpk", items), r"lib/sub/' is not allowed|not a regular")


def test_duplicate_names_are_refused(good, tmp_path):
    items = entries(good)
    lib = next(d for i, d in items if i.filename == "lib/model.so")
    items.append(("lib/model.so", lib[:100]))
    refused(rebuild(good, tmp_path / "t.dpk", items), r"member lib/model.so appears twice")


@pytest.mark.parametrize("keep", [0, 10, 0.5, -22])
def test_a_truncated_file_is_refused(good, tmp_path, keep):
    raw = good.read_bytes()
    n = keep if isinstance(keep, int) and keep >= 0 else (
        int(len(raw) * keep) if isinstance(keep, float) else len(raw) + keep)
    path = tmp_path / "t.dpk"
    path.write_bytes(raw[:n])
    refused(path, r"not a deploy artifact|truncated")


def _patch_directory(raw: bytearray, name: str, **fields) -> bytearray:
    """Set a central-directory entry's compressed/uncompressed size or local header offset."""
    at = 0
    while True:
        at = raw.index(b"PK\x01\x02", at)
        n = struct.unpack_from("<H", raw, at + 28)[0]
        if raw[at + 46:at + 46 + n] == name.encode():
            break
        at += 4
    where = {"compress_size": 20, "file_size": 24, "header_offset": 42}
    for key, value in fields.items():
        struct.pack_into("<I", raw, at + where[key], value)
    return raw


def test_a_member_past_the_end_of_the_file_is_refused(good, tmp_path):
    raw = _patch_directory(bytearray(good.read_bytes()), "lib/model.so",
                           compress_size=10**8, file_size=10**8)
    path = tmp_path / "t.dpk"
    path.write_bytes(bytes(raw))
    refused(path, r"member lib/model.so is truncated")


def test_declared_and_stored_sizes_must_agree(good, tmp_path):
    raw = _patch_directory(bytearray(good.read_bytes()), "lib/model.so", file_size=2**31)
    path = tmp_path / "t.dpk"
    path.write_bytes(bytes(raw))
    refused(path, r"member lib/model.so declares 2147483648 bytes but stores")


def test_a_compressed_member_is_refused_zip_bomb(good, tmp_path):
    bomb = zipfile.ZipInfo("weights/bomb.npy")
    bomb.compress_type = zipfile.ZIP_DEFLATED
    items = [*entries(good), (bomb, b"\0" * (16 << 20))]  # 16 MiB -> a few KiB
    path = rebuild(good, tmp_path / "t.dpk", items)
    assert path.stat().st_size < good.stat().st_size + 100_000
    refused(path, r"member weights/bomb.npy is compressed")


def test_overlapping_members_are_refused(good, tmp_path):
    """Directory entries pointing at one member's data many times (a 'flat' zip bomb)."""
    items = entries(good)
    lib_info = zipfile.ZipFile(good).getinfo("lib/model.so")
    items += [(f"lib/copy{k}.so", b"") for k in range(3)]
    raw = bytearray(rebuild(good, tmp_path / "a.dpk", items).read_bytes())
    lib_info = zipfile.ZipFile(tmp_path / "a.dpk").getinfo("lib/model.so")
    for k in range(3):
        _patch_directory(raw, f"lib/copy{k}.so", header_offset=lib_info.header_offset,
                         compress_size=lib_info.file_size, file_size=lib_info.file_size)
    path = tmp_path / "t.dpk"
    path.write_bytes(bytes(raw))
    refused(path, r"more than the \d+-byte file holds|not listed|unreadable")


def test_member_sizes_must_match_the_manifest(good, tmp_path):
    name = weight_name(good)
    path = edited(good, tmp_path / "t.dpk",
                  edit_manifest=lambda m: m["member_bytes"].update({name: 10}))
    refused(path, rf"member {name} is \d+ bytes; the manifest says 10")


# ---- the manifest ---------------------------------------------------------------------------

@pytest.mark.parametrize("version, match", [
    (3, r"format version 3, written by deploy .*is newer than this runtime reads .*upgrade deploy"),
    (0, r"format version 0, .*reads versions 1 and 2. Recompile"),
    ("2", r"format version '2'"), (True, r"format version True"), (None, r"format version None"),
])
def test_format_versions_are_checked(good, tmp_path, version, match):
    path = edited(good, tmp_path / "t.dpk", edit_manifest=lambda m: m.update(format_version=version))
    refused(path, match)


@pytest.mark.parametrize("producer", [None, 7, "", "not a version"])
def test_the_producing_version_is_checked(good, tmp_path, producer):
    path = edited(good, tmp_path / "t.dpk",
                  edit_manifest=lambda m: m.update(deploy_version=producer))
    refused(path, r"the manifest's deploy_version is .*names the deploy that wrote it")


def test_a_manifest_with_a_key_given_twice_is_refused(good, tmp_path):
    items = contents_of(good)
    items[MANIFEST] = items[MANIFEST].replace(b'{\n "compile_seconds"', b'{\n "format_version": 1,\n '
                                              b'"compile_seconds"', 1)
    items[DIGEST] = (hashlib.sha256(items[MANIFEST]).hexdigest() + "\n").encode()
    refused(rebuild(good, tmp_path / "t.dpk", items.items()), r"gives key 'format_version' twice")


@pytest.mark.parametrize("text", [b"[1, 2]", b"\xff\xfe{}", b"{", b"[" * 100000])
def test_a_manifest_that_is_not_a_json_object_is_refused(good, tmp_path, text):
    items = contents_of(good)
    items[MANIFEST] = text
    refused(rebuild(good, tmp_path / "t.dpk", items.items()), r"not a deploy artifact")


def test_a_manifest_naming_an_absent_member_is_refused(good, tmp_path):
    path = edited(good, tmp_path / "t.dpk", edit_manifest=lambda m: m.update(library="lib/x.so"))
    refused(path, r"the manifest's library names member 'lib/x.so', which the artifact does not")


def test_a_weight_smaller_than_the_plan_says_is_refused(good, tmp_path):
    """Rehashed, so only the .npy header against the value's shape catches it (a kernel would
    read past the end of the array)."""
    name = weight_name(good)
    small = io.BytesIO()
    np.save(small, np.zeros((2, 5), np.float32))
    path = edited(good, tmp_path / "t.dpk", members={name: small.getvalue()}, rehash=True)
    refused(path, rf"member {name} holds float32\[2, 5\] \(40 bytes\); the plan reads 80 bytes "
            r"for it \(float32\[4, 5\]\)")


@pytest.mark.parametrize("kind", ["pickle", "short", "header"])
def test_weights_are_never_unpickled_and_must_be_whole(good, tmp_path, kind):
    name = weight_name(good)
    buf = io.BytesIO()
    if kind == "pickle":
        np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    else:
        np.save(buf, np.zeros((4, 5), np.float32))
    data = buf.getvalue()
    data = {"pickle": data, "short": data[:-8], "header": b"\x93NUMPY\x01\x00" + data[8:40]}[kind]
    path = edited(good, tmp_path / "t.dpk", members={name: data}, rehash=True)
    refused(path, {"pickle": "holds Python objects", "short": r"declares float32\[4, 5\] \(80 "
                   r"bytes\) but holds 72", "header": "not a readable .npy"}[kind])


def test_not_an_artifact(tmp_path):
    for name, data in (("empty.dpk", b""), ("text.dpk", b"hello"), ("zip.dpk", None)):
        path = tmp_path / name
        if data is None:
            rebuild(path, path, [("a.txt", b"x")])
        else:
            path.write_bytes(data)
        refused(path, r"not a deploy artifact")
    with pytest.raises(ArtifactError, match="no such artifact"):
        deploy.load(tmp_path / "none.dpk")
    with pytest.raises(ArtifactError, match="not a file"):
        deploy.load(tmp_path)


def test_the_cli_refuses_a_tampered_artifact_without_a_traceback(good, tmp_path, capsys):
    lib = contents_of(good)["lib/model.so"]
    path = edited(good, tmp_path / "t.dpk", members={"lib/model.so": lib[:-4] + b"evil"})
    for cmd in ("inspect", "run"):
        assert main([cmd, str(path)]) == 1
        err = capsys.readouterr().err
        assert "member lib/model.so is corrupt" in err and "Traceback" not in err


# ---- version 1 ------------------------------------------------------------------------------

def _as_version_1(good: Path, out: Path, extra: dict | None = None) -> Path:
    """The artifact as the version 1 writer wrote it: no digest, no sizes."""
    items = contents_of(good)
    manifest = json.loads(items.pop(MANIFEST))
    items.pop(DIGEST)
    manifest.pop("member_bytes")
    manifest["format_version"] = 1
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return rebuild(good, out, [(MANIFEST, body), *sorted(items.items()), *(extra or {}).items()])


def test_version_1_artifacts_still_load_with_their_checks(good, tmp_path):
    old = _as_version_1(good, tmp_path / "v1.dpk")
    np.testing.assert_array_equal(deploy.load(old).run({"x": X})[0],
                                  deploy.load(good).run({"x": X})[0])
    refused(_as_version_1(good, tmp_path / "x.dpk", {DIGEST: b"0" * 64}),
            r"member manifest.sha256 is not listed")
    refused(_as_version_1(good, tmp_path / "y.dpk", {"../x": b""}), r"is not allowed")


# ---- the load path ----------------------------------------------------------------------------

def test_no_pickle_eval_or_exec_in_the_runtime():
    """The load path reads JSON, .npy (allow_pickle=False) and binaries: no module of the
    runtime calls eval/exec/compile/__import__, imports pickle or marshal, or np.load's without
    allow_pickle=False."""
    root = Path(deploy.__file__).resolve().parent / "runtime"
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "marshal", "shelve", "dill"} & {n.split(".")[0] for n in names}, path
            if isinstance(node, ast.Call):
                fn = node.func
                called = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
                if isinstance(fn, ast.Name) or getattr(getattr(fn, "value", None), "id", "") == "builtins":
                    assert called not in ("eval", "exec", "compile", "__import__"), \
                        (path, node.lineno)
                if called == "load" and getattr(getattr(fn, "value", None), "id", "") == "np":
                    kw = {k.arg: k.value for k in node.keywords}
                    assert getattr(kw.get("allow_pickle"), "value", True) is False, path
                if called == "import_module":
                    raise AssertionError(f"{path}:{node.lineno} imports a module by name")


def test_the_library_loaded_is_the_verified_file_in_a_private_folder(good):
    mod = deploy.load(good)
    lib = Path(mod._lib._name)
    digest = read_artifact(good).manifest["members"]["lib/model.so"]
    assert lib.name == f"{digest}.so" and hashlib.sha256(lib.read_bytes()).hexdigest() == digest
    assert stat.S_IMODE(lib.parent.stat().st_mode) == 0o700  # mkdtemp: this user only
    assert lib.parent.owner() == Path.home().owner() or os.getuid() == lib.parent.stat().st_uid


def test_an_interrupted_save_leaves_no_partial_file(tmp_path, monkeypatch):
    """write_zip writes a temporary file and renames it: a KeyboardInterrupt mid-write leaves
    the previous artifact whole and no temporary file."""
    from deploy.runtime import artifact
    art = deploy.compile(_model())
    path = art.save(tmp_path / "m.dpk")
    before = path.read_bytes()
    real = zipfile.ZipFile.writestr

    def interrupted(self, name, data, *a, **k):
        if str(getattr(name, "filename", name)).startswith("weights/"):
            raise KeyboardInterrupt
        return real(self, name, data, *a, **k)

    monkeypatch.setattr(zipfile.ZipFile, "writestr", interrupted)
    with pytest.raises(KeyboardInterrupt):
        artifact.write_artifact(path, art.manifest, art.members)
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["m.dpk"]


# ---- signatures -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    pytest.importorskip("cryptography")
    from deploy.runtime.signing import generate_key
    d = tmp_path_factory.mktemp("keys")
    for who in ("a", "b"):
        generate_key(d / f"{who}.pem", d / f"{who}.pub.pem")
    assert stat.S_IMODE((d / "a.pem").stat().st_mode) == 0o600
    return d


def test_a_signed_artifact_loads_with_its_key_and_not_with_another(good, keys, tmp_path):
    from deploy.runtime.signing import sign_artifact
    path, fp, n = sign_artifact(good, keys / "a.pem", out=tmp_path / "s.dpk")
    assert n == 1 and SIGNATURES in zipfile.ZipFile(path).namelist()
    mod = deploy.load(path, trusted_keys=[keys / "a.pub.pem"])
    np.testing.assert_array_equal(mod.run({"x": X})[0], deploy.load(good).run({"x": X})[0])
    assert read_artifact(path, [keys / "a.pub.pem"]).signed_by == fp
    deploy.load(path)  # signatures are checked only when asked for
    with pytest.raises(ArtifactError, match=r"signed by [0-9a-f]{16}; none of them is a trusted"):
        deploy.load(path, trusted_keys=[keys / "b.pub.pem"])
    # signed again with key b: both signatures; either key is enough
    _, _, n = sign_artifact(path, keys / "b.pem")
    assert n == 2
    deploy.load(path, trusted_keys=[keys / "b.pub.pem"])
    deploy.load(path, trusted_keys=[(keys / "a.pub.pem").read_bytes()])
    deploy.load(path, trusted_keys=str(keys / "a.pub.pem"))  # one key, not in a list


def test_an_unsigned_artifact_is_refused_with_trusted_keys(good, keys):
    with pytest.raises(ArtifactError, match=r"not signed, and trusted_keys requires a signature "
                       r"by one of: [0-9a-f]{16}. Sign it: deploy sign"):
        deploy.load(good, trusted_keys=[keys / "a.pub.pem"])


def test_a_signed_artifact_changed_and_rehashed_is_refused(good, keys, tmp_path):
    """Someone who knows the format swaps the library and rewrites every hash and the digest:
    integrity checks pass, the signature does not."""
    from deploy.runtime.signing import sign_artifact
    signed, _, _ = sign_artifact(good, keys / "a.pem", out=tmp_path / "s.dpk")
    path = edited(signed, tmp_path / "t.dpk", members={"lib/model.so": b"\x7fELF evil"},
                  rehash=True)
    read_artifact(path)  # consistent without a key
    with pytest.raises(ArtifactError, match=r"signature by trusted key [0-9a-f]{16} does not "
                       r"verify: the manifest was changed after signing"):
        deploy.load(path, trusted_keys=[keys / "a.pub.pem"])


def test_malformed_signatures_and_keys(good, keys, tmp_path):
    items = [*entries(good), (SIGNATURES, b"{not json")]
    path = rebuild(good, tmp_path / "t.dpk", items)
    with pytest.raises(ArtifactError, match=r"manifest.sig is malformed"):
        deploy.load(path, trusted_keys=[keys / "a.pub.pem"])
    with pytest.raises(UsageError, match=r"trusted_keys is empty"):
        deploy.load(good, trusted_keys=[])
    with pytest.raises(UsageError, match=r"that is a private key"):
        deploy.load(good, trusted_keys=[keys / "a.pem"])
    with pytest.raises(UsageError, match=r"cannot read it"):
        deploy.load(good, trusted_keys=[keys / "missing.pem"])
    with pytest.raises(ArtifactError, match=r"format version 1 artifacts carry no signatures"):
        deploy.load(_as_version_1(good, tmp_path / "v1.dpk"), trusted_keys=[keys / "a.pub.pem"])


def test_openssl_keys_work(good, keys, tmp_path):
    """Keys made by openssl (docs/reliability.md) sign and verify like deploy keygen's."""
    import shutil
    if not shutil.which("openssl"):
        pytest.skip("no openssl")
    key, pub = tmp_path / "o.pem", tmp_path / "o.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True)
    from deploy.runtime.signing import sign_artifact
    path, _, _ = sign_artifact(good, key, out=tmp_path / "s.dpk")
    deploy.load(path, trusted_keys=[pub])


def test_sign_keygen_and_verify_commands(good, keys, tmp_path, capsys):
    key = tmp_path / "k.pem"
    assert main(["keygen", str(key)]) == 0
    assert (tmp_path / "k.pub.pem").exists() and "k.pub.pem" in capsys.readouterr().out
    assert main(["keygen", str(key)]) == 2  # never overwrites a key
    assert "exists" in capsys.readouterr().err
    out = tmp_path / "s.dpk"
    assert main(["sign", str(good), "--key", str(key), "-o", str(out)]) == 0
    assert "signed" in capsys.readouterr().out
    assert main(["verify", str(out), "--trusted-key", str(tmp_path / "k.pub.pem")]) == 0
    text = capsys.readouterr().out
    assert "signed by" in text and "ok" in text
    assert main(["verify", str(out), "--trusted-key", str(keys / "a.pub.pem")]) == 1
    assert "none of them is a trusted key" in capsys.readouterr().err
    assert main(["verify", str(good)]) == 0
    assert "not signed" in capsys.readouterr().out


def test_loading_without_keys_never_imports_cryptography(good):
    code = (f"import sys, deploy\ndeploy.load({str(good)!r})\n"
            "print(any(k.split('.')[0] == 'cryptography' for k in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=True)
    assert r.stdout.strip() == "False"
