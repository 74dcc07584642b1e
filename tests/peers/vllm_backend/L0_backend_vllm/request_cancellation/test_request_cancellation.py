"""``request_cancellation_test.py`` as ``L0_backend_vllm/request_cancellation/test.sh`` runs it: one server for the file (started by
``tests/peers/vllm_backend/conftest.py`` with that script's repository and flags), each test
through unittest. See ``tests/peers/vllm_backend/README.md``."""

from __future__ import annotations

import pytest

from tests.peers.vllm_backend.runner import run_unittest_case, unittest_cases


@pytest.mark.parametrize("case", unittest_cases("request_cancellation_test"))
def test_request_cancellation(case: str) -> None:
    run_unittest_case("request_cancellation_test", case)
