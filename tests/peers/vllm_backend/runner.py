"""Run one of Triton's unittest-style CI test files the way its ``test.sh`` does:
``python3 <test>.py [Class.test] -v``, then ``check_test_results test_results.txt N`` (the
counts its ``TestResultCollector`` writes must show N tests and no error or failure).

pytest cannot drive those ``TestCase`` classes itself: their ``run`` override reads
``unittest.TestResult`` attributes that pytest's result object does not have. So each
``test_*.py`` wrapper here asks unittest to run one test at a time and reports it to pytest.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import unittest
from pathlib import Path
from types import ModuleType

import pytest

PEERS = Path(__file__).resolve().parent
PEER_FILES = {
    "vllm_backend_test": "L0_backend_vllm/vllm_backend/vllm_backend_test.py",
    "enabled_stream_test": "L0_backend_vllm/enabled_stream/enabled_stream_test.py",
    "request_cancellation_test": "L0_backend_vllm/request_cancellation/request_cancellation_test.py",
    "accuracy_test": "L0_backend_vllm/accuracy_test/accuracy_test.py",
    "vllm_metrics_test": "L0_backend_vllm/metrics_test/vllm_metrics_test.py",
}


def peer_module(name: str) -> ModuleType:
    """The peer test file, imported as the top-level module its ``test.sh`` runs."""
    if name in sys.modules:
        return sys.modules[name]
    for path in (PEERS, PEERS / "common"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    spec = importlib.util.spec_from_file_location(name, PEERS / PEER_FILES[name])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def unittest_cases(name: str) -> list[str]:
    """``Class.test_method`` for every test of the file, in unittest's order."""
    suite = unittest.defaultTestLoader.loadTestsFromModule(peer_module(name))
    cases: list[str] = []

    def walk(item: unittest.TestSuite | unittest.TestCase) -> None:
        if isinstance(item, unittest.TestSuite):
            for child in item:
                walk(child)
        else:
            cases.append(f"{type(item).__name__}.{item._testMethodName}")

    walk(suite)
    return cases


def run_unittest_case(name: str, case: str) -> None:
    """Run ``case`` with unittest (the working directory is the test.sh's, set by the server
    fixture); fail with unittest's own report, skip with its reason."""
    suite = unittest.defaultTestLoader.loadTestsFromName(case, peer_module(name))
    out = io.StringIO()
    result = unittest.TextTestRunner(stream=out, verbosity=2).run(suite)
    if result.skipped and result.testsRun == len(result.skipped):
        pytest.skip(result.skipped[0][1])
    assert result.wasSuccessful(), out.getvalue()
    # check_test_results test_results.txt 1 (ci/common/util.sh)
    counts = json.loads(Path("test_results.txt").read_text())
    assert counts == {"total": 1, "errors": 0, "failures": 0}, counts
