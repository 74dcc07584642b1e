"""What Triton's ``python/openai/tests/utils.py`` gives the peer tests, for this platform.

Triton's module starts its front end (``openai_frontend/main.py``) as a subprocess
(``OpenAIServer``) and, for some tests, an in-process ``tritonserver.Server`` wrapped in its
FastAPI app (``setup_server`` / ``setup_fastapi_app``). Here the front end under test is
``python -m serving.frontend`` in front of ``python -m serving.kserve``, both real processes
started by ``conftest.py``; :class:`FrontendServer` hands the tests the same clients
``OpenAIServer`` does. There is no in-process server or app to build, so the two setup functions
skip the tests that need them, with the reason (README.md lists those tests).
"""

from __future__ import annotations

from typing import NoReturn

import openai
import pytest

IN_PROCESS_REASON = (
    "needs Triton's in-process tritonserver.Server and its FastAPI app (a --tokenizer, "
    "--tool-call-parser or tool-parse limit given to the app); serving.frontend takes the "
    "tokenizer from the model repository and runs as its own process"
)


class FrontendServer:
    """The running front end, with ``OpenAIServer``'s accessors (``url_for``, clients)."""

    API_KEY = "EMPTY"

    def __init__(self, url_root: str) -> None:
        self.url_root = url_root

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.API_KEY, max_retries=0)

    def get_async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.API_KEY, max_retries=0)


def setup_server(*args: object, **kwargs: object) -> NoReturn:
    pytest.skip(IN_PROCESS_REASON)


def setup_fastapi_app(*args: object, **kwargs: object) -> NoReturn:
    pytest.skip(IN_PROCESS_REASON)
