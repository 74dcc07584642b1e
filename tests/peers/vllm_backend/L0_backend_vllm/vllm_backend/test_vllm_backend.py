"""``vllm_backend_test.py`` as ``L0_backend_vllm/vllm_backend/test.sh`` runs it: one server for the file (started by
``tests/peers/vllm_backend/conftest.py`` with that script's repository and flags), each test
through unittest. See ``tests/peers/vllm_backend/README.md``."""

from __future__ import annotations

import pytest

from tests.peers.vllm_backend.runner import run_unittest_case, unittest_cases


@pytest.mark.parametrize("case", unittest_cases("vllm_backend_test"))
def test_vllm_backend(case: str) -> None:
    run_unittest_case("vllm_backend_test", case)
