"""The key set's published form and the token estimate, without a gateway."""

from __future__ import annotations

import json

import pytest

from serving.gateway import keys
from serving.gateway.keys import KeyEntry, KeyTable, Limits, Refused


def entry(plaintext: str, team: str = "t", **fields) -> KeyEntry:
    return KeyEntry(keys.split_key(plaintext) or "", keys.digest(plaintext), team, **fields)


def test_a_document_reads_back_as_the_same_keys_and_limits():
    published = [
        entry("mlk_aaaa_x", models=("m", "n"), expires_at=1.5e9, limits=Limits(2.5, 1000)),
        entry("mlk_bbbb_y", team="u"),
    ]
    table = keys.parse(keys.document(published, {"t": Limits(tokens_per_minute=60)}))
    assert sorted(table.keys.values(), key=lambda k: k.prefix) == published
    assert table.teams == {"t": Limits(None, 60)}


@pytest.mark.parametrize(
    "change",
    [
        {"models": "m"},
        {"limits": {"requests_per_second": 0, "tokens_per_minute": None}},
        {"limits": {"requests_per_second": None, "tokens_per_minute": 1.5}},
        {"expires_at": "soon"},
    ],
)
def test_a_malformed_document_is_refused(change):
    item = json.loads(keys.document([entry("mlk_aaaa_x")], {}))["keys"][0]
    with pytest.raises(keys.KeyTableError):
        keys.parse(json.dumps({"keys": [{**item, **change}], "teams": {}}))


def test_keys_are_matched_by_digest_and_prefix_both():
    table = KeyTable([entry("mlk_aaaa_secret")])
    assert table.authenticate("mlk_aaaa_secret", "t/m").key.prefix == "aaaa"
    for wrong in ("mlk_aaaa_other", "mlk_bbbb_secret", "aaaa_secret", "mlk__secret", "mlk_aaaa_"):
        with pytest.raises(Refused) as refused:
            table.authenticate(wrong, "t/m")
        assert refused.value.status == 401


def test_the_header_may_be_a_bearer_authorization_or_x_api_key():
    assert keys.presented_key("Bearer  k1 ", None) == "k1"
    assert keys.presented_key("bearer k1", "k2") == "k1"
    assert keys.presented_key("Basic k1", "k2") == "k2"
    assert keys.presented_key(None, " ") is None


def test_tokens_are_estimated_from_the_body_and_max_tokens():
    def body(**fields) -> bytes:
        return json.dumps(fields).encode()

    chat = body(messages=[{"role": "user", "content": "x" * 400}], max_tokens=50, n=2)
    assert keys.estimate_tokens(chat) == -(-len(chat) // 4) + 100
    newer = body(prompt="hi", max_completion_tokens=7, max_tokens=9)
    assert keys.estimate_tokens(newer) == -(-len(newer) // 4) + 7
    kserve = body(text_input="hi", parameters={"max_tokens": 12})
    assert keys.estimate_tokens(kserve) == -(-len(kserve) // 4) + 12
    for unnamed in (b"\x00binary tensor", body(prompt="hi", max_tokens="9"), b"[" * 10_000):
        assert keys.estimate_tokens(unnamed) == -(-len(unnamed) // 4) + 256
