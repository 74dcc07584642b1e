"""The start-up sequence and the life of one serving instance.

    python -m serving.instance --package PKG.tar --workdir DIR [--engine tritonserver|cpu]
        [--host 127.0.0.1] [--openai-port 9000] [--http-port 8000] [--grpc-port 8001]
        [--metrics-port 8002] [--ready-timeout S] [--drain-timeout S]

Steps, in this order, each logged as one JSON line with its duration (see
:mod:`serving.instance.log`):

1. ``unpack_package``: verify every checksum and unpack into ``<workdir>/repository``.
2. ``install_plugins``: the package's author plugin wheels (manifest ``plugins``) installed
   afresh into ``<workdir>/plugins-site`` (``pip --no-deps --no-index --target``), then, in a
   child process with the engine's environment, every general plugin loaded and called and every
   logits processor (the author's and the platform's ``constraint_plugins``) loaded as vLLM
   will; anything that does not load refuses the start (:mod:`serving.instance.plugins`). The
   CPU engine serving a package without wheels skips the load: it runs no vLLM plugin. The
   engine then gets ``PYTHONPATH`` led by that directory and ``VLLM_PLUGINS`` naming exactly
   the declared general plugins.
3. ``clean_metrics_dir``: remove stale ``.db`` files from the multiprocess directory
   (``--multiproc-dir``, else ``$PROMETHEUS_MULTIPROC_DIR``, else ``<workdir>/prometheus``): values
   of a previous run must not be summed into this one's.
4. ``start_engine``: the engine as a child, ``tritonserver`` (GPU instance types) or the CPU
   engine ``python -m serving.kserve``, with one tritonserver command line
   (:mod:`serving.instance.engines`; ``--engine``, default ``$SERVING_ENGINE`` else ``cpu``).
   It is ready once Triton's ``/v2/health/ready`` and the model's ready endpoint answer 200.
5. ``start_frontend``: only now the front end listens: OpenAI routes when the package's API
   surface is ``openai+grpc`` (embedded), only health and ``/metrics`` when it is ``grpc``
   (standalone). Then ``INSTANCE READY openai=<port> http=<port> grpc=<port> metrics=<port>``
   is printed on stdout.

SIGTERM (or SIGINT): the front end stops accepting and finishes in-flight requests (streams
included) within ``--drain-timeout``; then the engine child gets SIGTERM (its own exit timeout is
the same budget) and what is left of the budget plus a margin before it is killed; exit 0. The
whole stop is bounded: ``--drain-timeout`` plus 10 s after the signal, the process ends
whatever still runs (:mod:`serving.instance.stop_deadline`). If the engine dies while serving,
the instance exits 3 so its launcher notices.

Exit status: 0 stopped cleanly (also when asked to stop during start-up); 1 the engine or the
front end failed to start; 2 the package or its plugins were refused; 3 the engine died while
serving; 4 the front end stopped on its own; 5 the stop overran its deadline and was cut
short.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from serving.instance.engine_process import EngineProcess
from serving.instance.engines import (
    ENGINES,
    EnginePorts,
    default_engine,
    engine_executable,
    local_address,
    resolve_ports,
    tritonserver_args,
)
from serving.instance.log import StepFailed, event, step
from serving.instance.plugins import install_plugins
from serving.instance.stop_deadline import STOP_MARGIN_SECONDS, StopDeadline
from serving.package import extract_package

API_SURFACES = {"openai+grpc": True, "grpc": False}  # → OpenAI routes on?
EXIT_START_FAILED, EXIT_REFUSED, EXIT_ENGINE_DIED, EXIT_FRONTEND_STOPPED = 1, 2, 3, 4
#: Seconds of the stop's budget kept back from the engine's SIGTERM-to-SIGKILL wait, so the
#: engine is killed (and waited for) before the stop deadline ends the process.
ENGINE_KILL_SECONDS = 2.0
#: Seconds past ``--drain-timeout`` the front end's shutdown hooks may take.
FRONTEND_SHUTDOWN_SECONDS = 2.0


class ManifestError(ValueError):
    pass


# The backends each engine serves: Triton's image has the vLLM and Python backends; the CPU
# engine stands in for both (Python-backend models run in serving.python_backend's processes).
ENGINE_BACKENDS = {"tritonserver": ("vllm", "python"), "cpu": ("vllm", "python")}


def check_manifest(manifest: dict[str, Any], engine: str = "cpu") -> dict[str, Any]:
    """The fields this instance acts on, checked: a package it cannot serve as asked is refused
    at start, not discovered at the first request."""
    for key in ("model", "backend", "api_surface"):
        if not isinstance(manifest.get(key), str) or not manifest[key]:
            raise ManifestError(f"manifest field {key!r} must be a non-empty string")
    if manifest["api_surface"] not in API_SURFACES:
        raise ManifestError(
            f"manifest api_surface {manifest['api_surface']!r} is not one of {sorted(API_SURFACES)}"
        )
    if manifest["backend"] not in ENGINE_BACKENDS[engine]:
        raise ManifestError(
            f"manifest backend {manifest['backend']!r}: the {engine} engine serves only "
            f"{' and '.join(ENGINE_BACKENDS[engine])}-backend packages"
        )
    plugins = manifest.get("constraint_plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ManifestError("manifest field 'constraint_plugins' must be a list of names")
    embedded = manifest.get("triton_embedded")
    if embedded is not None and embedded != (manifest["api_surface"] == "openai+grpc"):
        raise ManifestError("manifest triton_embedded contradicts its api_surface")
    return manifest


def unpack(package: Path, repository: Path, engine: str) -> dict[str, Any]:
    if repository.exists():
        shutil.rmtree(repository)  # a restart in the same workdir: the package is the truth
    return check_manifest(extract_package(package, repository), engine)


def clean_multiproc_dir(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    stale = list(directory.glob("*.db"))
    for path in stale:
        path.unlink()
    return len(stale)


class FrontendServer(uvicorn.Server):
    """uvicorn without its own signal handling: the supervisor owns SIGTERM and decides when
    the front end drains (and uvicorn would re-raise the signal after a clean drain)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    """Bind here rather than in uvicorn: a taken port is then an error this step reports (uvicorn
    would ``sys.exit`` inside the event loop), and port 0 gives a port the log can name."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def prepare_frontend(repository: Path, openai: bool) -> asyncio.Future[dict[str, Any]]:
    """Import the front end and load what its first requests need (tokenizers, XGrammar) on a
    thread of its own, beside the engine's start: seconds off every instance start. Whatever it
    raises is raised where the ``start_frontend`` step awaits it. Not a daemon thread: an
    instance whose start failed exits only once the thread is done (at most seconds, within the
    stop deadline), since a process that ends while a thread is still importing torch can abort
    (seen under load: exit -6 instead of 1)."""
    done: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

    def prepare() -> None:
        try:
            from serving.frontend.app import prepare_models

            done.set_result(prepare_models(repository, openai))
        except BaseException as exc:  # handed to the step that awaits it
            done.set_exception(exc)

    threading.Thread(target=prepare, name="prepare-frontend").start()
    return asyncio.wrap_future(done)


def frontend_server(
    args: argparse.Namespace,
    repository: Path,
    ports: EnginePorts,
    multiproc: Path,
    openai: bool,
    models: dict[str, Any],
) -> FrontendServer:
    from serving.frontend.app import create_app
    from serving.frontend.settings import Settings

    address = local_address(args.host)
    settings = Settings(
        model_repository=repository,
        kserve_grpc=f"{address}:{ports.grpc}",
        kserve_http=f"{address}:{ports.http}",
        kserve_metrics=f"http://{address}:{ports.metrics}/metrics",
        openai=openai,
        multiproc_dir=multiproc,
    )
    config = uvicorn.Config(
        create_app(settings, models),
        log_level="warning",
        timeout_graceful_shutdown=math.ceil(args.drain_timeout),
        lifespan="on",
    )
    return FrontendServer(config)


async def run(args: argparse.Namespace) -> int:
    deadline = StopDeadline(args.drain_timeout + STOP_MARGIN_SECONDS)
    try:
        return await _run(args, deadline)
    finally:
        # However the instance ends, what is left (asyncio.run joining its worker threads)
        # gets the stop's margin and no more.
        deadline.start()


async def _run(args: argparse.Namespace, deadline: StopDeadline) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_stop_signal() -> None:
        deadline.start()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop_signal)
    workdir: Path = args.workdir.resolve()
    repository = workdir / "repository"
    multiproc = (args.multiproc_dir or _env_multiproc_dir() or workdir / "prometheus").resolve()
    engine: EngineProcess | None = None
    frontend_ready: asyncio.Future[dict[str, Any]] | None = None
    event("starting", package=str(args.package), workdir=str(workdir))
    try:
        with step("unpack_package", exit_code=EXIT_REFUSED) as info:
            manifest = await asyncio.to_thread(unpack, args.package, repository, args.engine)
            info.update(model=manifest["model"], version=manifest.get("version"))
            info.update(api_surface=manifest["api_surface"])
        if stop.is_set():
            return _stopped_during_startup("unpack_package")
        with step("install_plugins", exit_code=EXIT_REFUSED) as info:
            info["requested"] = manifest.get("constraint_plugins", [])
            installed = await asyncio.to_thread(
                install_plugins, manifest, repository, workdir, progress=info, engine=args.engine
            )
            info.update(installed.info())
        if stop.is_set():
            return _stopped_during_startup("install_plugins")
        with step("clean_metrics_dir") as info:
            info["path"] = str(multiproc)
            info["removed"] = await asyncio.to_thread(clean_multiproc_dir, multiproc)
        openai = API_SURFACES[manifest["api_surface"]]
        frontend_ready = prepare_frontend(repository, openai)
        with step("start_engine") as info:
            engine = engine_process(
                args, repository, manifest["model"], multiproc, plugin_env=installed.env
            )
            info.update(engine=args.engine, command=engine.command)
            started = await engine.start(args.ready_timeout, stop)
            info["pid"] = deadline.engine_pid = engine.pid
            if started is not None:
                info.update(http=started.http, grpc=started.grpc, metrics=started.metrics)
        if started is None:
            frontend_ready.cancel()
            await engine.stop(deadline.remaining(minus=ENGINE_KILL_SECONDS))
            return _stopped_during_startup("start_engine")
        ports: EnginePorts = started
        with step("start_frontend") as info:
            models = await frontend_ready
            sock = listen(args.host, args.openai_port)
            openai_port = sock.getsockname()[1]
            info.update(port=openai_port, openai=openai)
            server = frontend_server(args, repository, ports, multiproc, openai, models)
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.02)
            if not server.started:
                raise RuntimeError("the front end did not start (see its log above)")
    except StepFailed as failed:
        if frontend_ready is not None:
            frontend_ready.cancel()  # what it raises, if anything, no longer matters
        if engine is not None:
            deadline.engine_pid = engine.pid
            await engine.stop(deadline.remaining(minus=ENGINE_KILL_SECONDS))
        event("start_aborted", step=failed.step, exit_code=failed.exit_code)
        return failed.exit_code
    print(
        f"INSTANCE READY openai={openai_port} http={ports.http} grpc={ports.grpc} "
        f"metrics={ports.metrics}",
        flush=True,
    )
    return await serve(args, engine, server, serving, stop, deadline)


async def serve(
    args: argparse.Namespace,
    engine: EngineProcess,
    server: FrontendServer,
    serving: asyncio.Task[None],
    stop: asyncio.Event,
    deadline: StopDeadline,
) -> int:
    """Serve until SIGTERM, the engine's death or the front end's; then stop within the
    deadline: the front end drains for ``--drain-timeout`` (its shutdown hooks included), and
    the engine gets what is left of the budget before it is killed."""
    engine_exit = asyncio.create_task(engine.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({engine_exit, stopped, serving}, return_when=asyncio.FIRST_COMPLETED)
    deadline.start()
    stopped.cancel()
    if engine_exit.done():
        event("engine_died", exit_code=engine_exit.result(), level="error")
        await drain_frontend(server, serving, args.drain_timeout)
        return EXIT_ENGINE_DIED
    engine_exit.cancel()
    if serving.done():
        event("frontend_stopped", level="error")
        await engine.stop(deadline.remaining(minus=ENGINE_KILL_SECONDS))
        return EXIT_FRONTEND_STOPPED
    event("draining", drain_timeout_s=args.drain_timeout)
    await drain_frontend(server, serving, args.drain_timeout)
    code = await engine.stop(deadline.remaining(minus=ENGINE_KILL_SECONDS))
    event("stopped", engine_exit_code=code)
    return 0


async def drain_frontend(server: FrontendServer, serving: asyncio.Task[None], drain: float) -> None:
    """Stop accepting and let requests in flight finish: uvicorn cancels those still running
    after ``drain``, then runs the app's shutdown hooks, which get a little more. A front end
    not done by then is left behind (the stop deadline ends the process)."""
    server.should_exit = True
    done, _ = await asyncio.wait({serving}, timeout=drain + FRONTEND_SHUTDOWN_SECONDS)
    if not done:
        event("frontend_drain_overran", drain_timeout_s=drain, level="error")


def engine_process(
    args: argparse.Namespace,
    repository: Path,
    model: str,
    multiproc: Path,
    *,
    plugin_env: dict[str, str] | None = None,
) -> EngineProcess:
    """The engine child for this package: one tritonserver command line, the chosen engine's
    executable, ``PROMETHEUS_MULTIPROC_DIR`` pointing at the directory just cleaned (vLLM
    writes its metrics there, the front end reads them back), and what the plugin step adds to
    the environment (``PYTHONPATH``, ``VLLM_PLUGINS``: :func:`plugins.plugin_environment`), the
    same for either engine."""
    ports = resolve_ports(args.host, args.http_port, args.grpc_port, args.metrics_port)
    command = [
        *engine_executable(args.engine),
        *tritonserver_args(
            repository, model, host=args.host, ports=ports, drain_timeout=args.drain_timeout
        ),
    ]
    env = {**os.environ, **(plugin_env or {}), "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
    return EngineProcess(
        command, env=env, ports=ports, address=local_address(args.host), model=model
    )


def _env_multiproc_dir() -> Path | None:
    value = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(value) if value else None


def _stopped_during_startup(after: str) -> int:
    event("stopped_during_startup", after=after)
    return 0


def parse_args(argv: list[str] | None = None, *, check_package: bool = True) -> argparse.Namespace:
    """The supervisor's options; ``check_package=False`` skips the package file's existence
    (to read a command line meant for another machine, such as a pod's)."""
    parser = argparse.ArgumentParser(prog="python -m serving.instance", description=__doc__)
    parser.add_argument("--package", type=Path, required=True)
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="tritonserver (GPU instance types) or cpu; default: $SERVING_ENGINE, else cpu",
    )
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--openai-port", type=int, default=9000)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument(
        "--multiproc-dir",
        type=Path,
        default=None,
        help="default: $PROMETHEUS_MULTIPROC_DIR, else <workdir>/prometheus",
    )
    args = parser.parse_args(argv)
    if args.engine is None:
        try:
            args.engine = default_engine()
        except ValueError as exc:
            parser.error(str(exc))
    for name in ("openai_port", "http_port", "grpc_port", "metrics_port"):
        if not 0 <= getattr(args, name) <= 65535:
            parser.error(f"--{name.replace('_', '-')} must be a port number (0-65535)")
    if args.ready_timeout <= 0:
        parser.error("--ready-timeout must be > 0")
    if args.drain_timeout < 0:
        parser.error("--drain-timeout must be >= 0")
    if check_package and not args.package.is_file():
        parser.error(f"--package {args.package} is not a file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(run(args))
