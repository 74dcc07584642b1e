"""``python -m serving.instance`` as a real process: the start-up sequence, refusals, readiness,
draining on SIGTERM and the death of the engine child."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.constraints import LOGITS_PROCESSOR
from serving.instance.stop_deadline import EXIT_STOP_OVERRAN, STOP_MARGIN_SECONDS
from tests.serving.instance_helpers import Instance, build_package, port_open

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

STEPS = ["unpack_package", "install_plugins", "clean_metrics_dir", "start_engine", "start_frontend"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def spawned_pid(instance: Instance) -> int:
    return next(e["pid"] for e in instance.events if e.get("event") == "engine_spawned")


def all_ports_closed(instance: Instance) -> bool:
    return not any(port_open(p) for p in instance.ports.values())


# --- refusals: nothing ever listens ----------------------------------------------------


def test_corrupt_package_aborts_before_anything_listens(tmp_path, demo_model_dir):
    package = build_package(tmp_path / "pkg.tar", demo_model_dir, corrupt=True)
    instance = Instance(package, tmp_path / "work")
    assert instance.proc.wait(60) == 2, instance.log()
    failed = instance.step("unpack_package")
    assert failed["status"] == "failed", instance.log()
    assert "sha256 does not match the manifest" in failed["error"]
    assert "config.pbtxt" in failed["error"]
    assert instance.steps() == ["unpack_package"]
    assert instance.events[-1]["event"] == "start_aborted"
    assert not (tmp_path / "work" / "repository").exists()
    assert all_ports_closed(instance)


def test_unknown_plugin_aborts_clearly(tmp_path, demo_model_dir):
    package = build_package(
        tmp_path / "pkg.tar",
        demo_model_dir,
        constraint_plugins=["platform-constraints", "acme-grammar"],
    )
    instance = Instance(package, tmp_path / "work")
    assert instance.proc.wait(60) == 2, instance.log()
    failed = instance.step("install_plugins")
    assert failed["status"] == "failed", instance.log()
    assert "unknown plugin 'acme-grammar'" in failed["error"]
    assert "platform-constraints" in failed["error"]  # says what is known
    assert "start_engine" not in instance.steps()
    assert all_ports_closed(instance)


def test_an_empty_vllm_plugins_does_not_refuse_the_package(tmp_path, demo_model_dir):
    """vLLM 0.24 applies ``VLLM_PLUGINS`` to its general plugins only, never to a logits
    processor named in model.json, so the step checks the package's plugins whatever it says
    (the engine then fails its deadline, so the test ends there)."""
    package = build_package(tmp_path / "pkg.tar", demo_model_dir)
    instance = Instance(package, tmp_path / "work", env={"VLLM_PLUGINS": ""}, ready_timeout=0.3)
    assert instance.proc.wait(120) == 1, instance.log()
    plugins = instance.step("install_plugins")
    assert plugins["status"] == "ok", instance.log()
    assert plugins["logits_processors"] == [LOGITS_PROCESSOR]


def test_engine_that_fails_to_load_aborts_start(tmp_path, demo_model_dir):
    package = build_package(
        tmp_path / "pkg.tar",
        demo_model_dir,
        engine_args={"max_num_seqs": 4, "no_such_engine_argument": 1},
        constraint_plugins=[],
    )
    instance = Instance(package, tmp_path / "work")
    assert instance.proc.wait(120) == 1, instance.log()
    failed = instance.step("start_engine")
    assert failed["status"] == "failed"
    assert "exited with status" in failed["error"] and "before it was ready" in failed["error"]
    assert "start_frontend" not in instance.steps()
    assert all_ports_closed(instance)


def test_ready_timeout_kills_the_engine(tmp_path, demo_model_dir):
    package = build_package(tmp_path / "pkg.tar", demo_model_dir, constraint_plugins=[])
    instance = Instance(package, tmp_path / "work", ready_timeout=0.3)
    assert instance.proc.wait(120) == 1, instance.log()
    assert "did not report ready within 0.3s" in instance.step("start_engine")["error"]
    assert not alive(spawned_pid(instance))
    assert all_ports_closed(instance)


# --- an embedded instance, from start to SIGTERM ------------------------------------------


class Started:
    def __init__(self, instance: Instance, ports: dict[str, int], first_ready_status: int):
        self.instance = instance
        self.ports = ports
        self.first_ready_status = first_ready_status
        self.base = f"http://127.0.0.1:{ports['openai']}"


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, demo_model_dir) -> Iterator[Started]:
    root = tmp_path_factory.mktemp("embedded")
    package = build_package(root / "pkg.tar", demo_model_dir)
    stale = root / "work" / "prometheus"
    stale.mkdir(parents=True)
    (stale / "counter_4242.db").write_bytes(b"\x00" * 64)  # left by a previous run
    instance = Instance(package, root / "work")
    port = instance.ports["openai_port"]
    # Poll the front-end port from the start: the first time it accepts, the engine must
    # already be ready (readiness is never observed false through an open port).

    def first_answer() -> int | None:
        if not port_open(port):
            return None
        try:  # a busy machine may take a while to answer; the first answer is what counts
            return httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=60).status_code
        except httpx.TimeoutException:
            return None

    first_status = instance.wait_for(first_answer, timeout=240)
    ports = instance.wait_ready(60)
    yield Started(instance, ports, first_status)
    if instance.proc.poll() is None:
        instance.stop()


def test_port_opens_only_once_the_engine_is_ready(embedded):
    assert embedded.first_ready_status == 200
    engine_ready = embedded.instance.step("start_engine")
    frontend = embedded.instance.step("start_frontend")
    assert engine_ready["status"] == "ok" and frontend["status"] == "ok"
    assert frontend["_seen"] >= engine_ready["_seen"]


def test_each_step_logged_once_in_order_with_duration(embedded):
    steps = [e for e in embedded.instance.events if e.get("event") == "step"]
    assert [e["step"] for e in steps] == STEPS
    for entry in steps:
        assert entry["status"] == "ok" and entry["duration_s"] >= 0
    plugins = embedded.instance.step("install_plugins")
    assert plugins["requested"] == ["platform-constraints"]
    assert plugins["logits_processors"] == [LOGITS_PROCESSOR]


def test_stale_metrics_files_are_removed(embedded):
    assert embedded.instance.step("clean_metrics_dir")["removed"] == 1


def metrics(base: str) -> tuple[dict, str]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def sample(families: dict, family: str, name: str) -> float:
    return sum(s.value for s in families[family].samples if s.name == name)


def test_unified_metrics_move_after_requests(embedded):
    before, _ = metrics(embedded.base)
    client = openai.OpenAI(base_url=f"{embedded.base}/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(model="demo--tiny", prompt="hello", max_tokens=5)
    assert completion.usage is not None
    after, text = metrics(embedded.base)
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names))
    up = {s.labels["source"]: s.value for s in after["serving_metrics_source_up"].samples}
    assert up == {"triton": 1.0, "vllm": 1.0}
    # (prometheus-client's parser reports Triton's suffix-less counter samples with "_total")
    count = ("nv_inference_count", "nv_inference_count_total")
    assert sample(after, *count) == sample(before, *count) + 1
    tokens = ("vllm:generation_tokens", "vllm:generation_tokens_total")
    assert sample(after, *tokens) == sample(before, *tokens) + completion.usage.completion_tokens
    prompt = ("vllm:prompt_tokens", "vllm:prompt_tokens_total")
    assert sample(after, *prompt) == sample(before, *prompt) + completion.usage.prompt_tokens


def test_sigterm_during_a_stream_lets_it_finish_then_exits_0(embedded):
    instance, port = embedded.instance, embedded.ports["openai"]
    engine_pid = spawned_pid(instance)
    body = {
        "model": "demo--tiny",
        "prompt": "hello",
        "max_tokens": 120,
        "ignore_eos": True,
        "stream": True,
    }
    chunks = []
    with httpx.stream("POST", f"{embedded.base}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        chunks.append(next(lines))
        instance.proc.send_signal(signal.SIGTERM)
        instance.wait_for(lambda: any(e.get("event") == "draining" for e in instance.events))
        instance.wait_for(lambda: not port_open(port), timeout=10)  # no new connections
        chunks.extend(lines)
    assert chunks[-1] == "data: [DONE]"
    last = json.loads(chunks[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] == "length"
    assert instance.proc.wait(60) == 0, instance.log()
    assert any(e.get("event") == "stopped" for e in instance.events)
    assert not alive(engine_pid)


# --- a standalone instance whose engine dies ---------------------------------------------


def test_standalone_serves_no_openai_and_exits_nonzero_when_engine_dies(tmp_path, demo_model_dir):
    package = build_package(
        tmp_path / "pkg.tar", demo_model_dir, api_surface="grpc", constraint_plugins=[]
    )
    instance = Instance(package, tmp_path / "work")
    try:
        ports = instance.wait_ready(240)
        base = f"http://127.0.0.1:{ports['openai']}"
        assert instance.step("start_frontend")["openai"] is False
        assert httpx.get(f"{base}/health/ready").status_code == 200
        assert httpx.get(f"{base}/v1/models").status_code == 404
        families, _ = metrics(base)
        assert "nv_inference_count" in families and "vllm:num_requests_running" in families
        os.kill(instance.step("start_engine")["pid"], signal.SIGKILL)
        assert instance.proc.wait(60) == 3, instance.log()
        died = next(e for e in instance.events if e.get("event") == "engine_died")
        assert died["exit_code"] == -signal.SIGKILL
    finally:
        if instance.proc.poll() is None:
            instance.stop()


# --- a stop that something inside the process would hold up -------------------------------

#: A chat template that renders for hours: loops within the sandbox's range limit, nested.
ENDLESS_TEMPLATE = (
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
)


def with_endless_chat_template(weights: Path, out: Path) -> Path:
    shutil.copytree(weights, out)
    jinja = out / "chat_template.jinja"
    if jinja.exists():
        jinja.write_text(ENDLESS_TEMPLATE)
    else:
        config_file = out / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["chat_template"] = ENDLESS_TEMPLATE
        config_file.write_text(json.dumps(config))
    return out


def test_sigterm_ends_the_instance_within_its_budget_though_a_thread_never_returns(
    tmp_path, demo_model_dir
):
    """The reproduction (issue 37): an instance did not exit within 30 s of SIGTERM. A chat
    request whose template never finishes holds a worker thread of the front end; cancelling
    the request cannot stop the thread, and asyncio.run waits for it at exit. Before the stop
    deadline the process never ended."""
    weights = with_endless_chat_template(demo_model_dir, tmp_path / "weights")
    package = build_package(tmp_path / "pkg.tar", weights)
    drain = 2
    instance = Instance(package, tmp_path / "work", drain_timeout=drain)
    ports = instance.wait_ready()
    engine_pid = spawned_pid(instance)
    supervisor = psutil.Process(instance.proc.pid)
    busy_before = sum(supervisor.cpu_times()[:2])

    def chat() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                f"http://127.0.0.1:{ports['openai']}/v1/chat/completions",
                json={"model": "demo--tiny", "messages": [{"role": "user", "content": "hi"}]},
                timeout=300,
            )

    threading.Thread(target=chat, daemon=True).start()
    # The template is rendering: the supervisor burns a CPU-second it would not spend idle.
    instance.wait_for(lambda: sum(supervisor.cpu_times()[:2]) > busy_before + 1.0, timeout=120)

    instance.proc.send_signal(signal.SIGTERM)
    budget = drain + STOP_MARGIN_SECONDS
    try:
        code = instance.proc.wait(budget + 60)  # the slack is a busy machine's, not the product's
    except subprocess.TimeoutExpired:
        instance.proc.kill()
        raise
    assert code == EXIT_STOP_OVERRAN, instance.log()
    assert any(e.get("event") == "stop_deadline_passed" for e in instance.events)
    assert any(e.get("event") == "stopped" for e in instance.events)  # the engine stopped first
    assert not alive(engine_pid)
