"""Memory that keeps no secret and refuses what it cannot store (issue 9, items 2 and 6), over a
real server: tags holding secrets, the built-in distiller after a late registration, dead
postings reclaimed from the search index, and numbers out of range."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from context_sidecar_client.v1 import sidecar_pb2 as pb

from tests.helpers import DETECTED, TOKENS, Tenant, bm25_ranking, call_error, postings_kept

REF = "mem:trust"
# 18 characters, one word run: the whole secret is one (lower-cased) search term.
LATE_SECRET = "Q7vRkmZp2WxT9sLdHc"


@pytest.fixture
def sidecar(start_server):
    return start_server(tenants=TOKENS, memory={"token_counter": "chars"},
                        compaction={"enabled": True, "interval_seconds": 3600, "min_entries": 1000,
                                    "keep_recent": 1, "token_budget": 2000, "max_output_bytes": 8000})


@pytest.fixture
def acme(sidecar) -> Tenant:
    return Tenant(sidecar.channel, TOKENS["acme"])


def put(tenant: Tenant, content: str, entry_id: str, **fields) -> pb.PutMemoryResponse:
    return tenant.PutMemory(pb.PutMemoryRequest(memory_ref=REF, content=content, entry_id=entry_id, **fields))


def register(tenant: Tenant, secret_id: str, value: str) -> None:
    tenant.RegisterSecrets(pb.RegisterSecretsRequest(secrets=[pb.Secret(secret_id=secret_id, value=value)]))


def live_pairs(sidecar) -> list[tuple[bytes, bytes, bytes]]:
    """(database name, key, value) of every record of every named database, found by walking the
    main database's list of names: what the store holds now, whatever pages LMDB keeps on its
    freelist (a raw scan of data.mdb also sees those old pages until they are reused)."""
    env = sidecar.services.store.env
    found = []
    with env.begin() as txn:
        names = [name for name, _ in txn.cursor()]
        for name in names:
            handle = env.open_db(name, txn=txn, create=False)
            found += [(name, key, value) for key, value in txn.cursor(db=handle)]
    return found


def holders(sidecar, needle: bytes) -> list[bytes]:
    """The names of the databases with a live key or value containing ``needle``."""
    return sorted({name for name, key, value in live_pairs(sidecar) if needle in key or needle in value})


def fragments(secret: str, size: int = 6) -> set[str]:
    """Every piece of ``size`` characters of the secret, as written and lower-cased (the index's form)."""
    pieces = {secret[i:i + size] for i in range(len(secret) - size + 1)}
    return pieces | {piece.lower() for piece in pieces}


def stray_fragments(data: bytes, secret: str) -> set[str]:
    """The fragments found in ``data`` outside every whole copy of the secret (as written or
    lower-cased). Whole copies in the raw file are the source's own bytes, stored before its
    secret was registered, on pages LMDB freed but has not reused yet; a fragment anywhere else
    was written by someone who cut the secret."""
    covered = bytearray(len(data))
    for whole in {secret.encode(), secret.lower().encode()}:
        at = data.find(whole)
        while at >= 0:
            covered[at:at + len(whole)] = b"\1" * len(whole)
            at = data.find(whole, at + 1)
    stray = set()
    for piece in fragments(secret):
        needle = piece.encode()
        at = data.find(needle)
        while at >= 0:
            if not all(covered[at:at + len(needle)]):
                stray.add(piece)
            at = data.find(needle, at + 1)
    return stray


# -- item 2: a tag is an identifier, never a place for a secret --------------------------------

@pytest.mark.parametrize("planted, named", [
    ("tenant-wide-tag-secret-1", "tw"), (DETECTED["aws_access_key_id"], "aws_access_key_id"),
    (DETECTED["slack_token"], "slack_token")], ids=["registered", "aws", "slack"])
def test_a_tag_holding_a_secret_is_refused_and_nothing_is_written(sidecar, acme, planted, named) -> None:
    register(acme, "tw", "tenant-wide-tag-secret-1")
    request_ = pb.PutMemoryRequest(memory_ref=REF, content="an ordinary note", entry_id="tagged",
                                   tags=["team-a", "ok", f"key:{planted}"])
    with pytest.raises(grpc.RpcError) as raised:
        acme.PutMemory(request_)
    assert call_error(acme.PutMemory, request_) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["tags[2]"])
    assert named in raised.value.details() and planted not in raised.value.details()
    assert list(acme.ListMemory(pb.ListMemoryRequest(memory_ref=REF)).entries) == []
    assert holders(sidecar, planted.encode()) == []
    assert planted.encode() not in (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()


def test_compaction_drops_a_source_tag_that_became_a_secret(sidecar, acme) -> None:
    """A tag stored before its value was registered is not carried into the distilled entry: the
    entry keeps only the tags a PutMemory would accept now (the sources, tag and all, are gone)."""
    late = "late-tag-secret-4711"
    for pair in ("ab", "cd"):
        put(acme, "Refunds are due within thirty days.", pair[0], tags=["billing", f"owner:{late}"])
        put(acme, "Shipping takes five days.", pair[1], tags=["billing", "shipping"])
    register(acme, "late", late)
    for pair, summary_text in (("ab", ""), ("cd", "Refunds and shipping, summarised by the host.")):
        done = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=list(pair),
                                                          summary_text=summary_text))
        output = acme.GetMemory(pb.GetMemoryRequest(memory_ref=REF, entry_id=done.output_id))
        assert sorted(output.tags) == sorted(["billing", "shipping", f"compacted-from:{done.compaction_id}"])
    assert holders(sidecar, late.encode()) == []


# -- item 2: the built-in distiller redacts before it cuts -------------------------------------

def test_the_distiller_keeps_no_fragment_of_a_late_registered_secret(sidecar, acme) -> None:
    # The secret straddles the distiller's 200-character cut: 14 of its 18 characters before it.
    long_line = "x" * 185 + " " + LATE_SECRET + " is the deploy key for the billing service"
    assert long_line.index(LATE_SECRET) == 186
    put(acme, long_line, "s0")
    put(acme, f"The billing service deploys with {LATE_SECRET} on Tuesdays.", "s1")
    put(acme, "The billing dashboard shows deploy history.", "s2")
    register(acme, "deploy", LATE_SECRET)
    done = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=["s0", "s1", "s2"]))
    output = acme.GetMemory(pb.GetMemoryRequest(memory_ref=REF, entry_id=done.output_id)).content
    for text in (output, done.event.json, done.SerializeToString().decode("utf-8", "replace")):
        assert not {piece for piece in fragments(LATE_SECRET) if piece in text}, text
    assert "[REDACTED:deploy]" in output, output  # from s1, whose first sentence is short
    assert all(line.count("[REDACTED:") == line.count("[REDACTED:deploy]") for line in output.splitlines()), \
        "a cut keeps a marker whole or drops it"
    for name, key, value in live_pairs(sidecar):
        found = {piece for piece in fragments(LATE_SECRET) if piece.encode() in key or piece.encode() in value}
        assert not found, (name, found)
    raw = (Path(sidecar.services.store.env.path()) / "data.mdb").read_bytes()
    assert stray_fragments(raw, LATE_SECRET) == set()


# -- item 2: no term outlives every entry that held it -----------------------------------------

def test_no_term_outlives_its_entries_and_ranking_still_equals_a_recount(sidecar, acme) -> None:
    """An entry's terms leave the index (its df record and every posting) when the last entry
    holding them is deleted, replaced, expired or compacted. Checked against the live records of
    every named database, walked with py-lmdb after the writes committed: the raw data.mdb may
    still hold the old pages on LMDB's freelist, which is not what the store keeps."""
    unique = {"delete": "Deletedterm1", "replace": "Replacedterm2", "expire": "Expiredterm3",
              "compact": "Compactedterm4"}
    live: dict[str, tuple[int, str]] = {}
    ordinal = 0

    def keep(content: str, entry_id: str, **fields) -> None:
        nonlocal ordinal
        put(acme, content, entry_id, **fields)
        live[entry_id] = (ordinal, content)
        ordinal += 1

    for i in range(12):
        keep(f"billing note {i} about refunds" + " refunds" * (i % 3), f"n{i}")
    keep(f"to delete: billing {unique['delete']}", "del")
    keep(f"to replace: refunds {unique['replace']}", "rep")
    keep(f"to expire: billing {unique['expire']}", "exp", ttl_seconds=1)
    keep(f"to compact: refunds {unique['compact']}", "c1")
    keep(f"also to compact: {unique['compact']} billing", "c2")
    for term in unique.values():
        assert holders(sidecar, term.lower().encode()) == [b"mem_df"], "the index holds each term while it lives"

    acme.DeleteMemory(pb.DeleteMemoryRequest(memory_ref=REF, entry_id="del"))
    live.pop("del")
    keep("replaced: billing refunds", "rep")
    done = acme.CompactMemory(pb.CompactMemoryRequest(memory_ref=REF, source_ids=["c1", "c2"],
                                                      summary_text="compacted: refunds and billing"))
    live.pop("c1"), live.pop("c2")
    live[done.output_id] = (ordinal, "compacted: refunds and billing")
    ordinal += 1
    time.sleep(1.2)  # past exp's TTL; the next write takes it out
    live.pop("exp")
    keep("the last billing note", "last")

    for name, term in unique.items():
        for needle in (term.lower().encode(), term.encode()):
            assert holders(sidecar, needle) == [], f"{name}: {needle!r} outlived its entries"
    for query in ("refunds", "billing", "billing refunds note", unique["delete"], unique["compact"]):
        expected = bm25_ranking(live, query)
        got = acme.ListMemory(pb.ListMemoryRequest(memory_ref=REF, rank="relevance", query=query)).entries
        assert [e.id for e in got] == [entry_id for entry_id, _ in expected], query
        assert [e.score for e in got] == pytest.approx([score for _, score in expected], rel=1e-9)


def test_dead_postings_in_sealed_segments_are_rewritten_away(sidecar, acme, small_segments) -> None:
    """Policy: a term's postings are rewritten without the dead ones when these outnumber the
    live ones, so a term never keeps more than twice the postings of its live entries."""
    live: dict[str, tuple[int, str]] = {}
    for i in range(200):
        content = f"common word {i}" + " common" * (i % 4)
        put(acme, content, f"e{i}")
        live[f"e{i}"] = (i, content)
    key = b"acme\0" + REF.encode() + b"\0"
    assert postings_kept(sidecar.services.store, key, "common") == (200, 200)
    for i in range(200):
        if i % 5:  # 160 deleted, 40 stay
            acme.DeleteMemory(pb.DeleteMemoryRequest(memory_ref=REF, entry_id=f"e{i}"))
            live.pop(f"e{i}")
            df, kept = postings_kept(sidecar.services.store, key, "common")
            assert df == len(live) and kept <= 2 * df, (i, df, kept)
    expected = bm25_ranking(live, "common word")
    got = acme.ListMemory(pb.ListMemoryRequest(memory_ref=REF, rank="relevance", query="common word")).entries
    assert [e.id for e in got] == [entry_id for entry_id, _ in expected]
    assert [e.score for e in got] == pytest.approx([score for _, score in expected], rel=1e-9)


# -- item 6: numbers out of range are refused, never INTERNAL ----------------------------------

OUT_OF_RANGE_PUTS = [
    (dict(ttl_seconds=10 ** 12), "ttl_seconds"),
    (dict(ttl_seconds=2 ** 63 - 1), "ttl_seconds"),
    (dict(embedding=[0.5, float("inf")]), "embedding"),
    (dict(embedding=[float("-inf")]), "embedding"),
]


@pytest.mark.parametrize("fields, field", OUT_OF_RANGE_PUTS, ids=[str(f) for f, _ in OUT_OF_RANGE_PUTS])
def test_out_of_range_puts_name_the_field_and_write_nothing(sidecar, acme, fields, field) -> None:
    request_ = pb.PutMemoryRequest(memory_ref=REF, content="c", entry_id="x", **fields)
    assert call_error(acme.PutMemory, request_) == (grpc.StatusCode.INVALID_ARGUMENT, "validation_error", [field])
    assert list(acme.ListMemory(pb.ListMemoryRequest(memory_ref=REF)).entries) == []
    assert holders(sidecar, REF.encode()) == []


# 100 years of 365 days: any real retention fits, and every expiry stays a valid Timestamp.
LONGEST_TTL = 3_153_600_000


def test_the_longest_ttl_is_a_century(acme) -> None:
    put(acme, "kept for a century", "long", ttl_seconds=LONGEST_TTL)
    entry = acme.GetMemory(pb.GetMemoryRequest(memory_ref=REF, entry_id="long"))
    assert entry.expires_at.ToMilliseconds() - entry.created_at.ToMilliseconds() == LONGEST_TTL * 1000
    request_ = pb.PutMemoryRequest(memory_ref=REF, content="c", entry_id="longer", ttl_seconds=LONGEST_TTL + 1)
    assert call_error(acme.PutMemory, request_) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["ttl_seconds"])
    assert [e.id for e in acme.ListMemory(pb.ListMemoryRequest(memory_ref=REF)).entries] == ["long"]


def test_an_infinite_query_embedding_names_its_field(acme) -> None:
    put(acme, "one entry", "one", embedding=[1.0])
    request_ = pb.ListMemoryRequest(memory_ref=REF, rank="relevance", query="entry", query_embedding=[float("inf")])
    assert call_error(acme.ListMemory, request_) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["query_embedding"])


def test_a_host_summary_over_the_entry_size_names_summary_text(acme) -> None:
    put(acme, "first", "a")
    put(acme, "second", "b")
    request_ = pb.CompactMemoryRequest(memory_ref=REF, source_ids=["a", "b"], summary_text="s" * 70_000)
    assert call_error(acme.CompactMemory, request_) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_error", ["summary_text"])
    assert sorted(e.id for e in acme.ListMemory(pb.ListMemoryRequest(memory_ref=REF)).entries) == ["a", "b"]
