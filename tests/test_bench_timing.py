"""The CPU benchmarks' timing (bench/cpu.py): alternating blocks and round-by-round ratios."""
from __future__ import annotations

import pytest
from deploy.bench import cpu


def test_blocks_alternate_engines_with_warmup(monkeypatch):
    monkeypatch.setattr(cpu.time, "sleep", lambda s: None)
    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b")]
    blocks = cpu.interleaved_blocks(fns, runs=6, warmup=2, rounds=3)
    assert [len(bs) for bs in blocks] == [3, 3] and all(len(b) == 2 for bs in blocks for b in bs)
    assert "".join(calls) == "aaaabbbb" * 3  # per block: 2 warm-up calls, then 2 timed


def test_paired_ratio_compares_round_by_round():
    # the machine ran at three times its speed in the second and third rounds for one engine's
    # blocks and in the first for the other's: whole medians would give 30 / 11; the rounds
    # where both ran alike agree on 10 / 11
    a = [[10.0, 10.2], [30.0, 30.0], [30.0, 30.0]]
    b = [[11.0, 11.0], [33.0, 33.0], [11.0, 11.2]]
    assert cpu.paired_ratio(a, b) == pytest.approx(10.1 / 11.0)
