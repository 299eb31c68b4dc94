"""Hostile target files (found by the fuzz harness, tests/fuzz): each is refused with a
TargetError of one short paragraph, quickly, whatever the file holds."""
from __future__ import annotations

import time

import pytest
from deploy.errors import TargetError
from deploy.targets import load_target
from deploy.targets.target import HERE

HOST = (HERE / "host.yaml").read_text()
BOMB = "".join(["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"] +
               [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]\n" for k in range(1, 9)])


def _refused(tmp_path, data: bytes, expect: str) -> str:
    path = tmp_path / "t.yaml"
    path.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(TargetError) as e:
        load_target(path)
    assert time.perf_counter() - start < 10
    text = str(e.value)
    assert text.startswith(f"{path}: ") and expect in text, text
    assert len(text) < 1000 and "\n\n" not in text
    return text


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    # billion laughs: 9**8 values in a key deploy reads (the message once quoted them all)
    _refused(tmp_path, (BOMB + HOST.replace("cores: 0", "cores: *a8")).encode(),
             "aliases (*name) are not accepted")


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    _refused(tmp_path, HOST.encode().replace(b"description: ", b"description: \xff"),
             "not UTF-8 text (byte 0xff at offset")
    _refused(tmp_path, ("# caf\xe9\n" + HOST).encode("latin-1"), "not UTF-8 text (byte 0xe9")


def test_a_file_over_64_kb_is_refused_unread(tmp_path):
    _refused(tmp_path, HOST.encode() + b"#" + b"x" * (10 << 20) + b"\n", "more than 64 KB")


def test_a_key_given_twice_is_refused(tmp_path):
    _refused(tmp_path, (HOST + "kind: gpu\n").encode(), "key 'kind' is given twice")


def test_deep_nesting_is_refused(tmp_path):
    _refused(tmp_path, HOST.encode() + b"isa: " + b"[" * 30_000 + b"]" * 30_000 + b"\n",
             "nested too deeply")


def test_lists_hold_strings_and_long_values_are_cut_in_messages(tmp_path):
    _refused(tmp_path, HOST.replace("cc_flags: [-march=native]", "cc_flags: [{a: 1}]").encode(),
             "key 'cc_flags' must be a list of strings")
    text = _refused(tmp_path, HOST.replace("name: host", f"name: [{'x, ' * 20_000}x]").encode(),
                    "key 'name' must be str")
    assert "..." in text


def test_python_tags_are_refused(tmp_path):
    _refused(tmp_path, (HOST + "zz: !!python/object/apply:os.system ['echo pwned']\n").encode(),
             "not valid YAML")


def test_a_nan_size_is_refused(tmp_path):
    _refused(tmp_path, (HOST + "mem_bandwidth_gbs: .nan\n").encode(),
             "key 'mem_bandwidth_gbs' must be >= 0, got nan")


@pytest.mark.parametrize("key, value", [("vector_bits", 300), ("warp_size", 48)])
def test_enumerated_sizes_are_checked_on_every_kind(tmp_path, key, value):
    """vector_bits and warp_size key tuning records: checked on CPU and GPU targets alike."""
    for name in ("host", "h100"):
        text = (HERE / f"{name}.yaml").read_text()
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key}:")]
        _refused(tmp_path, ("\n".join(lines) + f"\n{key}: {value}\n").encode(),
                 f"key '{key}' must be one of")
