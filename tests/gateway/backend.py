"""A stand-in instance for the gateway tests: a real HTTP server that says who it is.

    python -m tests.gateway.backend --port P --name NAME [--host 127.0.0.2]

``/v1/slow?seconds=S`` answers late, ``/v1/stream`` sends three Server-Sent Events a second
apart, ``/v1/die`` reads the request and then exits without answering, ``/v1/count`` says how
many requests reached it; anything else under ``/v1`` or ``/v2`` echoes the name, method and
path.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import web


def make_app(name: str) -> web.Application:
    seen = {"requests": 0}

    async def echo(request: web.Request) -> web.Response:
        seen["requests"] += 1
        body = await request.read()
        return web.json_response(
            {
                "backend": name,
                "method": request.method,
                "path": request.path,
                "query": request.query_string,
                "body": body.decode(),
                "auth": request.headers.get("Authorization", ""),
            }
        )

    async def slow(request: web.Request) -> web.Response:
        seen["requests"] += 1
        await asyncio.sleep(float(request.query.get("seconds", "2")))
        return web.json_response({"backend": name, "slow": True})

    async def stream(request: web.Request) -> web.StreamResponse:
        seen["requests"] += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for number in range(3):
            await response.write(f"data: {number}\n\n".encode())
            await asyncio.sleep(1)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def die(request: web.Request) -> web.Response:
        seen["requests"] += 1
        await request.read()
        os._exit(1)

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"backend": name, "requests": seen["requests"]})

    app = web.Application()
    app.router.add_route("*", "/v1/slow", slow)
    app.router.add_route("*", "/v1/stream", stream)
    app.router.add_route("*", "/v1/die", die)
    app.router.add_get("/v1/count", count)
    app.router.add_route("*", "/{tail:v[12]/.*}", echo)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="any loopback address: a pod's")
    args = parser.parse_args()
    print("BACKEND READY", flush=True)
    web.run_app(make_app(args.name), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
