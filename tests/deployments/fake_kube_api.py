"""A small Kubernetes API server on loopback: just the REST paths the launcher uses, storing
objects as JSON, so the official client's requests and parsing are exercised for real.

It has no controllers: the test plays the ReplicaSet and the kubelet by putting pods in it
(:meth:`FakeKubeApi.put`) and the Gateway by setting an HTTPRoute's status.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
POD_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386): dicts merge, ``None`` deletes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeKubeApi:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        #: (namespace, pod) → [(RFC 3339 time, line)], as the kubelet would keep them.
        self.logs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        #: The query of each log request, to check what the launcher asked for.
        self.log_queries: list[dict[str, list[str]]] = []
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                url = urlparse(self.path)
                log = POD_LOG.match(url.path)
                if log is not None and method == "GET":
                    with api.lock:
                        code, text = api.pod_log(*log.groups(), parse_qs(url.query))
                    data = text.encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                match = PATH.match(url.path)
                if match is None:
                    self._send(404, status(404, "NotFound"))
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with api.lock:
                    api.requests.append((method, url.path))
                    code, answer = api.handle(method, *match.groups(), parse_qs(url.query), body)
                self._send(code, answer)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()

    def handle(
        self,
        method: str,
        namespace: str,
        resource: str,
        name: str | None,
        query: dict[str, list[str]],
        body: dict[str, Any] | None,
    ) -> tuple[int, dict[str, Any]]:
        key = (resource, namespace, name or "")
        if name is None and method == "GET":
            selector = query.get("labelSelector", [""])[0]
            wanted = dict(p.split("=", 1) for p in selector.split(",") if p)
            items = [
                o
                for (r, ns, _), o in sorted(self.objects.items())
                if r == resource
                and ns == namespace
                and all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
            return 200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
        if name is None and method == "POST":
            assert body is not None
            key = (resource, namespace, body["metadata"]["name"])
            if key in self.objects:
                return 409, status(409, "AlreadyExists")
            stored = copy.deepcopy(body)
            stored["metadata"].update(generation=1, uid=f"uid-{len(self.objects)}")
            self.objects[key] = stored
            return 201, stored
        if key not in self.objects:
            return 404, status(404, "NotFound")
        if method == "GET":
            return 200, self.objects[key]
        if method == "PATCH":
            assert body is not None
            stored = self.objects[key]
            before = copy.deepcopy(stored.get("spec"))
            merge(stored, body)
            if stored.get("spec") != before:
                stored["metadata"]["generation"] = stored["metadata"].get("generation", 1) + 1
            return 200, stored
        if method == "DELETE":
            del self.objects[key]
            return 200, status(200, "")
        return 405, status(405, "MethodNotAllowed")

    def pod_log(self, namespace: str, name: str, query: dict[str, list[str]]) -> tuple[int, str]:
        """``sinceSeconds``, ``tailLines``, ``limitBytes`` and ``timestamps`` as the kubelet
        applies them (the time filter against this machine's clock)."""
        self.log_queries.append(query)
        if ("pods", namespace, name) not in self.objects:
            return 404, json.dumps(status(404, "NotFound"))
        lines = list(self.logs.get((namespace, name), []))
        if "sinceSeconds" in query:
            cutoff = time.time() - int(query["sinceSeconds"][0])
            lines = [(t, line) for t, line in lines if _unix(t) >= cutoff]
        if "tailLines" in query:
            count = int(query["tailLines"][0])
            lines = lines[-count:] if count else []
        stamped = query.get("timestamps", ["false"])[0].lower() == "true"  # Go reads "True"
        text = "".join(f"{t} {line}\n" if stamped else f"{line}\n" for t, line in lines)
        if "limitBytes" in query:
            text = text.encode()[: int(query["limitBytes"][0])].decode("utf-8", "ignore")
        return 200, text

    # --- what the test does as the cluster -----------------------------------------------

    def log(self, namespace: str, name: str, line: str, at: float | None = None) -> None:
        """Append a line to a pod's log, stamped with ``at`` (default now) in nanoseconds."""
        moment = datetime.fromtimestamp(time.time() if at is None else at, tz=UTC)
        stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}123Z"
        with self.lock:
            self.logs.setdefault((namespace, name), []).append((stamp, line))

    def put(self, resource: str, namespace: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.objects[(resource, namespace, obj["metadata"]["name"])] = obj

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((resource, namespace, name))

    def names(self, resource: str) -> list[str]:
        return sorted(name for (r, _, name) in self.objects if r == resource)

    def launcher(self):
        """A Kubernetes launcher whose official client talks to this server (the settings it
        reads, e.g. the namespace, are the caller's to set first)."""
        from kubernetes import client as k8s

        from portal.deployments.runtime.launchers.kubernetes import KubernetesLauncher

        configuration = k8s.Configuration()
        configuration.host = self.url
        return KubernetesLauncher(api_client=k8s.ApiClient(configuration))


def status(code: int, reason: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Success" if code < 400 else "Failure",
        "reason": reason,
        "code": code,
    }


def _unix(stamp: str) -> float:
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    return seconds + float(f"0.{fraction or 0}")
