"""Plugin wheels read as data (portal.registry.plugins): the worked examples pass with their entry
points, and every way a wheel can be wrong is refused with a reason an author can act on."""

from __future__ import annotations

import random
import string
import zipfile
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError

from portal.registry import plugins
from portal.registry.models import PluginWheel
from portal.registry.plugins import (
    PluginRefused,
    clash_errors,
    inspect_wheel,
    requirement_errors,
    serving_image_packages,
)
from portal.registry.services import register_version, upload_plugin_wheel
from tests.factories import make_version
from tests.plugin_examples import example_wheels
from tests.plugin_wheels import make_wheel

RELEASE = SimpleNamespace(name="triton-26.07", vllm_version="0.24.0")
LOGITS = {"vllm.logits_processors": {"no_repeat": "no_repeat:NoRepeat"}}


def refused(path, *needles: str, **kwargs) -> str:
    with pytest.raises(PluginRefused) as caught:
        inspect_wheel(path, **kwargs)
    message = str(caught.value)
    for needle in needles:
        assert needle in message, message
    return message


def test_the_example_wheels_are_accepted_with_their_entry_points():
    wheels = example_wheels()
    window = inspect_wheel(wheels["no_repeat_window"], release=RELEASE)
    assert (window.name, window.version) == ("no-repeat-window", "1.0.0")
    assert window.logits_processors == {"no_repeat_window": "no_repeat_window:NoRepeatWindow"}
    assert window.general_plugins == {}
    assert window.requires == ["vllm==0.24.0"]
    assert window.size == wheels["no_repeat_window"].stat().st_size
    assert len(window.sha256) == 64

    bigram = inspect_wheel(wheels["tiny_bigram"], release=RELEASE)
    assert bigram.general_plugins == {"tiny_bigram": "tiny_bigram:register"}
    assert bigram.logits_processors == {}
    assert clash_errors([window, bigram]) == []


def test_an_sdist_is_refused(tmp_path):
    sdist = tmp_path / "no_repeat-1.0.0.tar.gz"
    sdist.write_bytes(b"not read")
    refused(sdist, "only wheels", "nothing may execute at install")
    refused(tmp_path / "x.whl", "only wheels", filename="no_repeat-1.0.0.zip")


def test_a_wheel_without_vllm_entry_points_is_refused(tmp_path):
    wheel = make_wheel(tmp_path, "helper", entry_points={"console_scripts": {"h": "helper:main"}})
    refused(wheel, "declares no entry point", "vllm.general_plugins", "vllm.logits_processors")
    refused(make_wheel(tmp_path / "bare", "bare"), "declares no entry point")


def test_a_wheel_requiring_another_vllm_is_refused(tmp_path):
    wheel = make_wheel(tmp_path, "old-plugin", entry_points=LOGITS, requires=["vllm==0.11"])
    inspect_wheel(wheel)  # without a release, only the wheel itself is read
    refused(
        wheel, "requires vllm==0.11, the release triton-26.07 pins vllm 0.24.0", release=RELEASE
    )


def test_requirements_are_checked_against_the_serving_image(tmp_path):
    errors = requirement_errors(
        [
            "foo-lib>=1",
            "torch<2",
            "torch>=2.1",  # the image's 2.13.0: fine
            "numpy; python_version < '3.10'",  # not for the image's Python
            "pywin32; sys_platform == 'win32'",  # not for Linux
            "rich; extra == 'pretty'",  # extras are ignored
            "VLLM>=0.20,<0.25",
        ],
        RELEASE,
    )
    assert errors == [
        "requires foo-lib, which the serving image does not have; vendor it or ask the operators",
        "requires torch<2, the serving image of release triton-26.07 has torch 2.13.0",
    ]
    wheel = make_wheel(tmp_path, "needs-foo", entry_points=LOGITS, requires=["foo-lib"])
    refused(wheel, "requires foo-lib, which the serving image does not have", release=RELEASE)


def test_the_serving_image_list_carries_the_pinned_stack():
    packages = serving_image_packages()
    assert packages["vllm"] == "0.24.0"
    assert {"torch", "triton", "tritonclient", "transformers"} <= set(packages)


def test_a_wheel_over_the_size_limit_is_refused(tmp_path, settings):
    wheel = make_wheel(tmp_path, "big", entry_points=LOGITS, files={"big.py": "x = 1\n" * 400})
    settings.PLUGIN_WHEEL_MAX_BYTES = 100
    refused(wheel, "over the limit of 100 bytes")


def test_a_metadata_over_its_cap_is_refused_unread(tmp_path):
    """A METADATA over the cap (compressed too little to be refused as a bomb): refused from its
    declared size; and one that declares a small size is inflated no further than that (zipfile
    then finds its CRC wrong)."""
    text = "".join(
        random.Random(0).choices(string.ascii_lowercase, k=2 * plugins.METADATA_MAX_BYTES)
    )
    wheel = make_wheel(tmp_path, "bomb", entry_points=LOGITS, description=text,
                       compression=zipfile.ZIP_DEFLATED)  # fmt: skip
    member = "bomb-1.0.0.dist-info/METADATA"
    refused(wheel, f"{member} is over {plugins.METADATA_MAX_BYTES} bytes")

    with zipfile.ZipFile(wheel) as archive:
        declared = archive.getinfo(member).file_size.to_bytes(4, "little")
    raw = wheel.read_bytes()
    assert raw.count(declared) == 2  # its local header and its central directory entry
    wheel.write_bytes(raw.replace(declared, (1000).to_bytes(4, "little")))
    refused(wheel, f"Bad CRC-32 for file '{member}'")


def test_a_member_with_an_absurd_compression_ratio_is_refused(tmp_path):
    wheel = make_wheel(tmp_path, "zeros", entry_points=LOGITS, files={"zeros/data.bin": "\0" * (8 << 20)},
                       compression=zipfile.ZIP_DEFLATED)  # fmt: skip
    refused(wheel, "'zeros/data.bin' inflates")


def test_a_member_leaving_the_archive_is_refused(tmp_path):
    for name in ("../evil.py", "/etc/evil.py", "pkg/../../evil.py"):
        wheel = make_wheel(tmp_path / str(len(name)), "sneaky", entry_points=LOGITS,
                           files={name: "x = 1\n"})  # fmt: skip
        refused(wheel, "leaves the archive")


def test_bad_entry_point_values_and_names_are_refused(tmp_path):
    for value in ("no_repeat", "no_repeat:", "no-repeat:Cls", "mod:Cls [extra]", "a:b:c"):
        wheel = make_wheel(
            tmp_path / str(abs(hash(value))), "badep",
            entry_points={"vllm.logits_processors": {"proc": value}},
        )  # fmt: skip
        refused(wheel, "is not 'module:attr'")
    dotted = make_wheel(
        tmp_path / "ok", "dotted", entry_points={"vllm.general_plugins": {"reg": "a.b : c.d"}}
    )
    assert inspect_wheel(dotted).general_plugins == {"reg": "a.b:c.d"}


def test_tags_the_serving_image_cannot_install_are_refused(tmp_path):
    for tag in ("cp310-cp310-manylinux2014_x86_64", "py3-none-win_amd64",
                "cp311-cp311-manylinux_2_17_aarch64", "cp311-cp311-manylinux_2_39_x86_64"):  # fmt: skip
        refused(make_wheel(tmp_path / tag, "native", entry_points=LOGITS, tag=tag), "accepted:")
    for tag in ("cp311-cp311-manylinux_2_17_x86_64", "cp311-abi3-manylinux2014_x86_64"):
        assert inspect_wheel(make_wheel(tmp_path / tag, "native", entry_points=LOGITS, tag=tag))


def test_unreadable_archives_and_mismatched_metadata_are_refused(tmp_path):
    broken = tmp_path / "broken-1.0.0-py3-none-any.whl"
    broken.write_bytes(b"PK\x03\x04 truncated")
    refused(broken, "not a readable zip archive")
    wheel = make_wheel(tmp_path, "real-name", entry_points=LOGITS)
    renamed = wheel.with_name("other_name-1.0.0-py3-none-any.whl")
    wheel.rename(renamed)
    refused(renamed, "METADATA names 'real-name'")
    link = make_wheel(tmp_path / "link", "linky", entry_points=LOGITS)
    with zipfile.ZipFile(link, "a") as archive:
        info = zipfile.ZipInfo("linky/evil")
        info.external_attr = 0o120777 << 16
        archive.writestr(info, "/etc/passwd")
    refused(link, "symbolic link")


def test_two_plugins_clashing_in_one_version(tmp_path):
    one = inspect_wheel(make_wheel(tmp_path / "a", "one", entry_points=LOGITS))
    two = inspect_wheel(make_wheel(tmp_path / "b", "two", entry_points=LOGITS))
    again = inspect_wheel(make_wheel(tmp_path / "c", "one", "2.0.0", entry_points={
        "vllm.general_plugins": {"reg": "one:register"}}))  # fmt: skip
    (message,) = clash_errors([one, two])
    assert "both declare the entry point 'no_repeat' in [vllm.logits_processors]" in message
    (message,) = clash_errors([one, again])
    assert "are both the distribution one" in message
    assert "over the limit of 10 bytes" in clash_errors([one], max_total_bytes=10)[0]


@pytest.mark.django_db
def test_registration_refuses_duplicate_entry_point_names(team, model, release, artifact_root,
                                                          tmp_path):  # fmt: skip
    rows = []
    for name in ("one", "two"):
        path = make_wheel(tmp_path / name, name, entry_points=LOGITS)
        row, created = upload_plugin_wheel(
            team=team, chunks=[path.read_bytes()], filename=path.name
        )
        assert created
        rows.append(row)
    with pytest.raises(ValidationError) as caught:
        make_version(model, artifact_root, plugins=[r.sha256 for r in rows])
    (message,) = caught.value.message_dict["plugins"]
    assert "both declare the entry point 'no_repeat'" in message
    version = make_version(model, artifact_root, plugins=[rows[0].pk])
    assert list(version.plugins.all()) == rows[:1]
    assert PluginWheel.objects.count() == 2


@pytest.mark.django_db
def test_python_backend_versions_take_no_plugins(team, model, release, artifact_root, tmp_path):
    path = make_wheel(tmp_path, "one", entry_points=LOGITS)
    row, _ = upload_plugin_wheel(team=team, chunks=[path.read_bytes()], filename=path.name)
    with pytest.raises(ValidationError) as caught:
        register_version(
            model=model, artifact_uri=f"file://{artifact_root}/m", backend="python",
            io_spec={"inputs": [{"name": "T", "data_type": "TYPE_STRING", "dims": [1]}],
                     "outputs": [{"name": "O", "data_type": "TYPE_FP32", "dims": [1]}]},
            python_model="class TritonPythonModel:\n    pass\n", plugins=[row.sha256],
        )  # fmt: skip
    assert "a Python-backend version runs your model.py" in caught.value.message_dict["plugins"][0]


@pytest.mark.django_db
def test_pooling_models_take_no_logits_processor_plugins(team, model, release, artifact_root,
                                                         tmp_path):  # fmt: skip
    path = make_wheel(tmp_path, "one", entry_points=LOGITS)
    row, _ = upload_plugin_wheel(team=team, chunks=[path.read_bytes()], filename=path.name)
    with pytest.raises(ValidationError) as caught:
        make_version(model, artifact_root, engine_args={"runner": "pooling"}, plugins=[row.pk])
    assert "refuses custom logits processors" in caught.value.message_dict["plugins"][0]
