"""Secret redaction (SR-1): registered secrets, built-in detectors, canonical markers, and JSON
redacted string by string. The sweep over every write path is tests/text/test_secrets_sweep.py."""

from __future__ import annotations

import json

import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from sidecar.caching import Caches
from sidecar.errors import ValidationError
from sidecar.text.redaction import SECRET_MATCHERS, Redactor, redact_json_text
from tests.helpers import DETECTED, TOKENS, Tenant


def test_registered_secrets_longest_first_and_scoped() -> None:
    redactor = Redactor()
    redactor.register("t", "", [("db", "hunter2-password"), ("db-long", "hunter2-password-extended")])
    redactor.register("t", "run-1", [("run-key", "only-this-run-9")])
    text = "use hunter2-password-extended, or hunter2-password; and only-this-run-9"
    assert redactor.redact("t", "", text).text == \
        "use [REDACTED:db-long], or [REDACTED:db]; and only-this-run-9"
    in_run = redactor.redact("t", "run-1", text)
    assert in_run.text == "use [REDACTED:db-long], or [REDACTED:db]; and [REDACTED:run-key]"
    assert in_run.secret_ids == ("db-long", "db", "run-key")
    assert redactor.redact("other-tenant", "run-1", text).text == text  # tenants never share secrets
    assert redactor.forget("t", "", ["db"]) == 1
    assert redactor.redact("t", "", "hunter2-password").text == "hunter2-password"
    assert redactor.forget("t", "run-1", []) == 1


@pytest.mark.parametrize("secrets, field", [
    ([("ok", "tiny")], "secrets[0].value"),
    ([("ok", "long-enough-1"), ("bad id", "long-enough-2")], "secrets[1].secret_id"),
    ([("a]b", "long-enough-1")], "secrets[0].secret_id"),
])
def test_bad_secrets_are_refused_without_echoing_them(secrets, field) -> None:
    with pytest.raises(ValidationError) as raised:
        Redactor().register("t", "", secrets)
    assert raised.value.violations[0].field == field
    assert all(value not in raised.value.message for _, value in secrets)


@pytest.mark.parametrize("kind", sorted(DETECTED))
def test_detectors_need_no_registration(kind: str) -> None:
    redacted = Redactor().redact("t", "", f"before {DETECTED[kind]} after")
    assert redacted.text == f"before [REDACTED:{kind}] after"
    assert redacted.secret_ids == (kind,)


def test_bearer_headers_keep_the_header_and_detectors_can_be_off() -> None:
    text = "curl -H 'Authorization: Bearer abc.def-123456789' https://x"
    assert Redactor().redact("t", "", text).text == "curl -H 'Authorization: Bearer [REDACTED:bearer_token]' https://x"
    assert Redactor(detectors=False).redact("t", "", text).text == text


@pytest.mark.parametrize("bearer", ["Bearer", "BEARER", "bearer", "bEaReR"])
def test_bearer_headers_are_found_in_any_letter_case(bearer: str) -> None:
    text = f"authorization={bearer} abc.def-123456789"  # nothing else in the text calls for a redaction pass
    assert Redactor().redact("t", "", text).text == f"authorization={bearer} [REDACTED:bearer_token]"


@pytest.mark.parametrize(("leaked", "canonical"), [("<REDACTED:stripe>", "[REDACTED:stripe]"),
                                                   ("[BYOK:abc123]", "[REDACTED:byok]")])
def test_a_leaked_form_alone_is_made_canonical(leaked: str, canonical: str) -> None:
    assert Redactor(detectors=False).redact("t", "", f"a {leaked} b").text == f"a {canonical} b"


def test_leaked_forms_become_canonical() -> None:
    redacted = Redactor().redact("t", "", "a <REDACTED:stripe> b [BYOK:sk_live_123abc] c [REDACTED:kept]")
    assert redacted.text == "a [REDACTED:stripe] b [REDACTED:byok] c [REDACTED:kept]"


def test_markers_are_deterministic() -> None:
    first, second = Redactor(), Redactor()
    for redactor in (first, second):
        redactor.register("t", "", [("k", "value-of-the-key")])
    text = "value-of-the-key " + DETECTED["jwt"]
    assert first.redact("t", "", text) == second.redact("t", "", text)


def test_json_is_redacted_string_by_string_and_stays_json() -> None:
    redactor = Redactor()
    redactor.register("t", "", [("pin", "4111111111111111"), ("pw", "hunter2-password")])
    redact = redactor.redacting("t", "")
    text = ('{"b": "hunter2-password", "a": [4111111111111111, 12, true, null], '
            '"' + DETECTED["openai_api_key"] + '": {"x": "h\\u0075nter2-password"}}')
    redacted, value = redact_json_text(text, redact, "json")
    assert value == {"b": "[REDACTED:pw]", "a": ["[REDACTED:pin]", 12, True, None],
                     "[REDACTED:openai_api_key]": {"x": "[REDACTED:pw]"}}
    assert redacted == json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    untouched = '{ "b" : "nothing secret",  "a": [1, 2.5e3] }'
    assert redact_json_text(untouched, redact, "json")[0] == untouched  # byte for byte when nothing is redacted
    with pytest.raises(ValidationError) as raised:
        redact_json_text('{"hunter2-password": 1, "[REDACTED:pw]": 2}', redact, "profile.tools[0].parameters_json")
    assert raised.value.violations[0].field == "profile.tools[0].parameters_json"
    assert "hunter2" not in raised.value.message


def test_redacted_memory_is_searchable_by_its_marker(start_server) -> None:
    sidecar = start_server(tenants=TOKENS)
    acme = Tenant(sidecar.channel, TOKENS["acme"])
    acme.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="api", value="zebra-quokka-4711")]))
    acme.PutMemory(pb.PutMemoryRequest(memory_ref="mem:a", content="call it with zebra-quokka-4711", entry_id="m"))
    found = acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a", rank="relevance", query="quokka"))
    assert [e.id for e in found.entries] == []  # the plaintext is not in the index either
    assert [e.id for e in acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a", rank="relevance",
                                                               query="redacted api")).entries] == ["m"]


def test_the_matchers_kept_stay_within_their_bytes_and_follow_every_registration() -> None:
    """Every run that redacts once kept a matcher entry (most saying "no secret") for as long as
    the process lived; they are a cache now, bounded in bytes, and a registration is seen at once."""
    caches = Caches(bounds={SECRET_MATCHERS.name: 20_000})
    redactor = Redactor(caches=caches)
    for n in range(2_000):
        assert redactor.redact("t", f"run-{n}", "nothing secret here").text == "nothing secret here"
    [figures] = [figure for figure in caches.figures() if figure.name == SECRET_MATCHERS.name]
    assert 0 < figures.bytes <= 20_000 and figures.evictions > 0
    redactor.register("t", "", [("db", "hunter2-correct-horse")])  # after run-1999's matcher was kept
    assert redactor.redact("t", "run-1999", "pw hunter2-correct-horse").text == "pw [REDACTED:db]"
    redactor.register("t", "run-1999", [("db", "another-battery-staple")])  # the run's own value wins
    assert redactor.redact("t", "run-1999", "another-battery-staple").text == "[REDACTED:db]"
    redactor.forget("t", "run-1999", [])
    assert redactor.redact("t", "run-1999", "another-battery-staple").text == "another-battery-staple"
