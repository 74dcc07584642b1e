"""A stand-in for an instance's front end that serves only ``GET /observations``, from the front
end's own :class:`~serving.frontend.observations.ObservationLog`, filled by the test with the
requests it wants the canary analysis to see. For the controller's decisions on the memory
launcher; ``test_canary_end_to_end.py`` reads real front ends."""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from serving.frontend.observations import ObservationLog


class ObservationsServer:
    def __init__(self) -> None:
        self.log = ObservationLog(capacity=50_000, per_second=1e9)
        log = self.log

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path != "/observations":
                    self.send_error(404)
                    return
                after = int(parse_qs(url.query).get("after", ["0"])[0])
                body = json.dumps(log.read(after)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add_requests(
        self,
        count: int,
        since: float,
        until: float,
        *,
        latency: float = 0.2,
        spread: float = 0.3,
        status: int = 200,
        seed: int = 0,
    ) -> None:
        """``count`` answered completions that ended evenly over ``[since, until]``, with
        lognormal latencies around ``latency``."""
        rng = random.Random(seed)
        for i in range(count):
            took = latency * rng.lognormvariate(0, spread)
            self.log.add(
                at=since + (until - since) * (i + 0.5) / count,
                model="m",
                route="completions",
                status=status,
                latency_s=took,
                ttft_s=None,
                tpot_s=None,
                prompt_tokens=5,
                completion_tokens=8 if status == 200 else None,
                finish_reason="length" if status == 200 else None,
                empty=False if status == 200 else None,
                structured=False,
                structured_valid=None,
                greedy=False,
                error=None if status == 200 else "internal_error",
            )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
