"""``enabled_stream_test.py`` as ``L0_backend_vllm/enabled_stream/test.sh`` runs it: one server for the file (started by
``tests/peers/vllm_backend/conftest.py`` with that script's repository and flags), each test
through unittest. See ``tests/peers/vllm_backend/README.md``."""

from __future__ import annotations

import pytest

from tests.peers.vllm_backend.runner import run_unittest_case, unittest_cases


@pytest.mark.parametrize("case", unittest_cases("enabled_stream_test"))
def test_enabled_stream(case: str) -> None:
    run_unittest_case("enabled_stream_test", case)
