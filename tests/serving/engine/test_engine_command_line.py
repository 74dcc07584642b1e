"""One command line for both engines: the flags the supervisor gives, the CPU engine's parser,
and Triton's own option table (r26.07) that both are held to."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

import pytest

from serving.instance.engines import (
    TRITONSERVER_DEFAULT_BIN,
    EnginePorts,
    engine_executable,
    engine_for_gpus,
    local_address,
    resolve_ports,
    tritonserver_args,
)
from serving.kserve import cli
from serving.kserve.cli import option_names, parse_options, triton_bool

TABLE = Path(__file__).resolve().parents[2] / "data" / "tritonserver_options_r26.07.txt"
# How each of the CPU engine's options takes its value, in Triton's table's words.
KINDS = {
    triton_bool: "ArgBool",
    cli.port: "ArgInt",
    cli.non_negative: "ArgInt",
    None: "ArgStr",
    Path: "ArgStr",
    cli.backend_setting: '"<string>,<string>=<string>"',
}


def triton_options() -> dict[str, str]:
    lines = [line.split(maxsplit=1) for line in TABLE.read_text().splitlines()]
    return {name: kind for name, kind in lines if not name.startswith("#")}


def supervisor_flags(**overrides) -> list[str]:
    kwargs = {
        "host": "127.0.0.1",
        "ports": EnginePorts(http=18000, grpc=18001, metrics=18002),
        "drain_timeout": 12.5,
        **overrides,
    }
    return tritonserver_args(Path("/work/repository"), "team--model", **kwargs)


def flag_name(flag: str) -> str:
    return flag.removeprefix("--").split("=", 1)[0]


def test_the_copied_table_is_tritons_whole_option_table():
    table = triton_options()
    assert len(table) == 91
    assert table["http-port"] == "ArgInt" and table["strict-readiness"] == "ArgBool"
    assert table["backend-config"] == '"<string>,<string>=<string>"'


def test_every_cpu_engine_option_is_a_tritonserver_option_of_the_same_kind():
    table = triton_options()
    assert option_names() - table.keys() == set()
    for action in cli._parser()._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                assert table[option[2:]] == KINDS[action.type], option


def test_every_supervisor_flag_is_a_tritonserver_option_and_the_cpu_engine_accepts_it():
    flags = supervisor_flags()
    assert {flag_name(f) for f in flags} <= triton_options().keys()
    assert {flag_name(f) for f in flags} <= option_names()
    options = parse_options(flags)
    assert options.model_repository == Path("/work/repository")
    assert (options.http_address, options.grpc_address, options.metrics_address) == (
        "127.0.0.1",
        "127.0.0.1",
        "127.0.0.1",
    )
    assert (options.http_port, options.grpc_port, options.metrics_port) == (18000, 18001, 18002)
    assert options.model_control_mode == "explicit"
    assert options.models_to_load() == ["team--model"]
    assert options.exit_timeout_secs == 13  # the drain budget, rounded up to whole seconds
    assert options.log_level == logging.INFO


def test_the_command_line_is_the_same_for_both_engines_but_the_executable(monkeypatch):
    monkeypatch.delenv("TRITONSERVER_BIN", raising=False)
    assert engine_executable("tritonserver") == [TRITONSERVER_DEFAULT_BIN]
    assert engine_executable("cpu") == [sys.executable, "-m", "serving.kserve"]
    monkeypatch.setenv("TRITONSERVER_BIN", "/opt/bin/my tritonserver --flag")
    assert engine_executable("tritonserver") == shlex.split("/opt/bin/my tritonserver --flag")
    assert engine_executable("cpu") == [sys.executable, "-m", "serving.kserve"]
    with pytest.raises(ValueError, match="unknown engine"):
        monkeypatch.delenv("TRITONSERVER_BIN")
        engine_executable("onnx")


def test_gpus_choose_triton():
    assert engine_for_gpus(0) == "cpu"
    assert engine_for_gpus(1) == engine_for_gpus(8) == "tritonserver"


def test_triton_syntax_both_forms_and_its_boolean_words():
    options = parse_options(
        ["--model-store", "/r", "--http-port", "1", "--grpc-port=2", "--allow-metrics=ON"]
    )
    assert (options.model_repository, options.http_port, options.grpc_port) == (Path("/r"), 1, 2)
    for word, value in [
        ("true", True),
        ("On", True),
        ("1", True),
        ("false", False),
        ("OFF", False),
    ]:
        assert triton_bool(word) is value
    with pytest.raises(argparse.ArgumentTypeError, match="invalid value for bool option: yes"):
        triton_bool("yes")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grpc-use-ssl=true"], "unrecognized arguments: --grpc-use-ssl=true"),
        (["--http-por=1"], "unrecognized arguments: --http-por=1"),  # no abbreviations
        (["--temperature=0.1"], "unrecognized arguments"),
        (["--allow-grpc=false"], "--allow-grpc=false is not supported"),
        (["--exit-on-error=false"], "--exit-on-error=false is not supported"),
        (["--strict-readiness=maybe"], "invalid value for bool option: maybe"),
        (["--model-control-mode=poll"], "--model-control-mode=poll is not supported"),
        (["--load-model=m"], "--load-model requires --model-control-mode=explicit"),
        (["--http-port=70000"], "70000 is not a port number"),
        (["--exit-timeout-secs=-1"], "-1 must be >= 0"),
        (["--backend-config=python"], "--backend-config expects <backend>,<setting>=<value>"),
        (["--log-format=json"], "--log-format must be one of"),
    ],
)
def test_refused_flags_say_why(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_options(["--model-repository=/r", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_explicit_mode_loads_only_the_named_models_and_star_loads_all():
    explicit = ["--model-repository=/r", "--model-control-mode=explicit"]
    assert parse_options([*explicit, "--load-model=b", "--load-model=a"]).models_to_load() == [
        "b",
        "a",
    ]
    assert parse_options(explicit).models_to_load() == []
    assert parse_options([*explicit, "--load-model=*"]).models_to_load() is None
    assert parse_options(["--model-repository=/r"]).models_to_load() is None


def test_log_switches_become_one_threshold():
    base = ["--model-repository=/r"]
    assert parse_options([*base, "--log-verbose=1"]).log_level == logging.DEBUG
    assert parse_options([*base, "--log-info=false"]).log_level == logging.WARNING
    quiet = ["--log-info=0", "--log-warning=0", "--log-error=0"]
    assert parse_options([*base, *quiet]).log_level > logging.CRITICAL


def test_zero_ports_are_resolved_to_distinct_free_ports_and_given_ones_kept():
    ports = resolve_ports("127.0.0.1", 0, 0, 0)
    assert len({ports.http, ports.grpc, ports.metrics}) == 3 and 0 not in vars(ports).values()
    assert resolve_ports("127.0.0.1", 8000, 0, 8002).http == 8000


def test_wildcard_addresses_are_reached_over_loopback():
    assert local_address("0.0.0.0") == "127.0.0.1"
    assert local_address("::") == "[::1]"
    assert local_address("10.1.2.3") == "10.1.2.3"
    assert local_address("fd00::1") == "[fd00::1]"
