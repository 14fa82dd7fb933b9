"""Secret redaction (SR-1): registered secrets, built-in detectors, canonical markers, and a
sweep that plants secrets through every write path and then searches the LMDB file's raw bytes
and every answer for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import ValidationError
from sidecar.pb.contextsidecar.v1 import sidecar_pb2 as pb
from sidecar.redaction import Redactor
from tests.test_memory import TOKENS, Tenant

DETECTED = {
    "openai_api_key": "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "anthropic_api_key": "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
    "github_token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "slack_token": "xoxb-1234567890-abcdefghij",
    "google_api_key": "AIza" + "SyA1234567890abcdefghijklmnopqrstuv",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "private_key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq\n-----END RSA PRIVATE KEY-----",
}


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


def test_leaked_forms_become_canonical() -> None:
    redacted = Redactor().redact("t", "", "a <REDACTED:stripe> b [BYOK:sk_live_123abc] c [REDACTED:kept]")
    assert redacted.text == "a [REDACTED:stripe] b [REDACTED:byok] c [REDACTED:kept]"


def test_markers_are_deterministic() -> None:
    first, second = Redactor(), Redactor()
    for redactor in (first, second):
        redactor.register("t", "", [("k", "value-of-the-key")])
    text = "value-of-the-key " + DETECTED["jwt"]
    assert first.redact("t", "", text) == second.redact("t", "", text)


def test_no_plaintext_secret_reaches_the_store_or_any_answer(start_server, tmp_path: Path, caplog) -> None:
    sidecar = start_server(tenants=TOKENS, summarization=True, keep_last_turns=1, transcript_token_budget=5000)
    acme = Tenant(sidecar.channel, TOKENS["acme"])
    tenant_wide, in_run = "tenant-wide-secret-0001", "run-only-secret-0002"
    acme.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="tw", value=tenant_wide)]))
    answer = acme.RegisterSecrets(pb.RegisterSecretsRequest(run_id="r", secrets=[pb.Secret(secret_id="rs", value=in_run)]))
    plaintexts = [tenant_wide, in_run, *DETECTED.values()]
    leak = " | ".join(plaintexts)
    # Memory is the tenant's: a run's secret does not apply there, so it is not planted there.
    leak_in_memory = " | ".join(p for p in plaintexts if p != in_run)
    answers: list[bytes] = [answer.SerializeToString()]

    def keep(response) -> None:
        answers.append(response.SerializeToString())

    # Every write path: AppendEvents, AssembleContext's append_events, RecordSummary, PutMemory.
    keep(acme.AppendEvents(pb.AppendEventsRequest(run_id="r", events=[
        pb.Event(event_id="e1", iteration=1, role="user", content="first " + leak)])))
    keep(acme.AssembleContext(pb.AssembleContextRequest(run_id="r", iteration=1, append_events=[
        pb.Event(event_id="e2", role="tool", content="second " + leak)])))
    keep(acme.AssembleContext(pb.AssembleContextRequest(run_id="r", iteration=2, append_events=[
        pb.Event(event_id="e3", role="user", content="third")])))
    recorded = acme.RecordSummary(pb.RecordSummaryRequest(run_id="r", iteration=3, replaced_event_ids=["e1", "e2"],
                                                         summary_text="summary that leaks " + leak))
    keep(recorded)
    put = acme.PutMemory(pb.PutMemoryRequest(memory_ref="mem:a", content="memory " + leak_in_memory, entry_id="m"))
    keep(put)
    assert set(put.redacted_secret_ids) == {"tw", *DETECTED}
    # Every read path.
    keep(acme.AssembleContext(pb.AssembleContextRequest(run_id="r", iteration=3)))
    keep(acme.GetTranscriptWindow(pb.GetTranscriptWindowRequest(run_id="r", iteration=3)))
    keep(acme.ListRunEvents(pb.ListRunEventsRequest(run_id="r")))
    keep(acme.GetArtifact(pb.GetArtifactRequest(run_id="r", artifact_id=recorded.summary_ref)))
    keep(acme.GetMemory(pb.GetMemoryRequest(memory_ref="mem:a", entry_id="m")))
    keep(acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a")))
    keep(acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a", rank="relevance", query="memory")))

    events = acme.ListRunEvents(pb.ListRunEventsRequest(run_id="r")).events
    assert "[REDACTED:tw]" in events[0].content and "[REDACTED:rs]" in events[0].content
    assert "[REDACTED:jwt]" in events[1].content
    summary_text = acme.GetArtifact(pb.GetArtifactRequest(run_id="r", artifact_id=recorded.summary_ref)).content
    assert "[REDACTED:rs]" in summary_text and "[REDACTED:private_key]" in summary_text
    assert "[REDACTED:tw]" in acme.GetMemory(pb.GetMemoryRequest(memory_ref="mem:a", entry_id="m")).content
    stored = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    assert b"[REDACTED:tw]" in stored  # the file is readable as it is: what was stored is there
    for plaintext in plaintexts:
        needle = plaintext.encode("utf-8")
        assert needle not in stored, f"{plaintext[:12]}... is in the LMDB file"
        assert all(needle not in answer_bytes for answer_bytes in answers), f"{plaintext[:12]}... was answered"
        assert plaintext not in caplog.text


def test_redacted_memory_is_searchable_by_its_marker(start_server) -> None:
    sidecar = start_server(tenants=TOKENS)
    acme = Tenant(sidecar.channel, TOKENS["acme"])
    acme.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id="api", value="zebra-quokka-4711")]))
    acme.PutMemory(pb.PutMemoryRequest(memory_ref="mem:a", content="call it with zebra-quokka-4711", entry_id="m"))
    found = acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a", rank="relevance", query="quokka"))
    assert [e.id for e in found.entries] == []  # the plaintext is not in the index either
    assert [e.id for e in acme.ListMemory(pb.ListMemoryRequest(memory_ref="mem:a", rank="relevance",
                                                               query="redacted api")).entries] == ["m"]
