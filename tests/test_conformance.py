"""CI fast tier of the ONNX conformance suite (tests/conformance.py; full run: docs/conformance.md).

A fixed, deterministic subset (every FAST_NODE_STRIDE-th node case by name, plus the light
squeezenet and shufflenet models) runs through deploy, each case in its own process. Cases listed
in tests/conformance_xfail.txt are strict xfails, so a case that starts passing fails here until
it is removed from the list; every other case must pass. The subset runs in parallel over all
cores in one batch (under pytest-xdist, case by case on each worker instead).
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from deploy.tests import conformance as conf
from deploy.tests.conformance_report import read_json, read_xfail

PASS_FLOOR = 1933  # deploy's total pass count in the last full report must not fall below this
ALL_CASES = conf.load_cases()
FAST = conf.fast_subset(ALL_CASES)
XFAIL = read_xfail(conf.XFAIL_FILE)


def _params() -> list:
    def marks(case):
        return ([pytest.mark.xfail(strict=True, reason=XFAIL[case.name])]
                if case.name in XFAIL else [])
    return [pytest.param(case, id=case.name, marks=marks(case)) for case in FAST]


class _FastResults:
    """deploy results of the fast-tier cases, run on first use in one parallel batch."""

    def __init__(self, session):
        self.selected = [item.callspec.params["case"] for item in session.items
                         if getattr(item, "originalname", "") == "test_fast_tier"]
        self.batch = not os.environ.get("PYTEST_XDIST_WORKER")
        self.results: dict[str, conf.Result] = {}

    def get(self, case: conf.Case) -> conf.Result:
        if case.name not in self.results:
            todo = self.selected if self.batch else [case]
            for r in conf.run_isolated(todo, ("deploy",), jobs=None if self.batch else 1):
                self.results[r.case] = r
        return self.results[case.name]


@pytest.fixture(scope="session")
def fast_results(request) -> _FastResults:
    return _FastResults(request.session)


@pytest.mark.parametrize("case", _params())
def test_fast_tier(case, fast_results):
    r = fast_results.get(case)
    assert r.status == "pass", f"{case.kind}/{case.name}: [{r.status}] {r.detail}"


# ----------------------------------------------------------------------------- the last full run

def test_full_report_covers_the_suite_and_keeps_the_floor():
    report = read_json(conf.REPORT_JSON)
    names = {c.name for c in ALL_CASES}
    assert set(report["cases"]) == names, "docs/conformance.json is not a full run of this suite"
    passed = sum(v.get("deploy") == "pass" for v in report["cases"].values())
    assert passed == report["totals"]["deploy"]["total"]
    assert passed >= PASS_FLOOR, f"full run passes {passed} cases, below the floor {PASS_FLOOR}"


def test_xfail_list_names_real_cases_with_reasons():
    names = {c.name for c in ALL_CASES}
    unknown = sorted(set(XFAIL) - names)
    assert not unknown, f"tests/conformance_xfail.txt names cases the suite lacks: {unknown[:5]}"
    assert all(XFAIL.values())


# ----------------------------------------------------------------------------- the harness itself

def test_compare_classifies_mismatches():
    a = np.array([1.0, np.nan], np.float32)
    conf.compare([a], [a.copy()], 1e-3, 1e-7)  # NaN == NaN, as onnx's runner
    cases = [([a], [a[:1]], "shape/dtype-mismatch"), ([a], [a.astype(np.float64)],
             "shape/dtype-mismatch"), ([a], [a + 1], "numeric-mismatch"),
             ([a], [a, a], "shape/dtype-mismatch"), ([[a]], [a], "shape/dtype-mismatch")]
    for refs, outs, status in cases:
        with pytest.raises(conf.Mismatch) as e:
            conf.compare(refs, outs, 1e-3, 1e-7)
        assert e.value.status == status


def test_isolation_turns_crashes_and_hangs_into_results():
    case = next(c for c in ALL_CASES if c.name == "test_relu")
    t0 = time.monotonic()
    results = conf.run_isolated([case], (conf.selftest_crash, conf.selftest_hang, "deploy"), jobs=3,
                                timeout=10)
    status = {r.backend: r.status for r in results}
    assert status == {"selftest_crash": "crash", "selftest_hang": "timeout",
                      "deploy": "pass"}
    assert time.monotonic() - t0 < 40
