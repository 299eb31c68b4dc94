"""The fuzz harness (issue 19 item 1) in the test tiers: the fast tier runs the first
FAST_CASES cases of the seed-0 run (all five families); ``-m slow`` runs the whole 10,000.
Both require no crash, hang, silent acceptance or bad message; a failure lists each case as
``family#index`` (rerun one with ``python -m deploy.tests.fuzz --replay family#index``)."""
from __future__ import annotations

import os

import pytest

from .pool import run_fuzz

FAST_CASES = 500
# one fuzz worker beside another pytest-xdist worker, two when pytest runs alone
JOBS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


def _assert_clean(report) -> None:
    failures = report.failures()
    assert not failures, report.table() + "\n" + "\n".join(
        f"{r.id} [{r.label}] {r.outcome}: {r.detail[:800]}" for r in failures)


def test_the_pool_records_crashes_hangs_and_raw_exceptions_and_goes_on():
    report = run_fuzz(5, seed=0, jobs=JOBS, families=["selftest"], timeout=5)
    outcomes = {r.index: r.outcome for r in report.records}
    assert outcomes == {0: "crash", 1: "hang", 2: "crash", 3: "error", 4: "error"}
    by_index = {r.index: r for r in report.records}
    assert "signal 11" in by_index[0].detail and "Fatal Python error" in by_index[0].detail
    assert "KeyError" in by_index[2].detail


def test_fuzz_fast_tier():
    _assert_clean(run_fuzz(FAST_CASES, seed=0, jobs=JOBS))


@pytest.mark.slow
def test_fuzz_10000_cases():
    _assert_clean(run_fuzz(10_000, seed=0, jobs=JOBS))
