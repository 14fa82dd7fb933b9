"""Answers spliced from stored bytes: the wire's fast path for the per-turn call and for memory.

A stored event record is wire-compatible with WindowEntry and a stored memory record with
MemoryEntry (sidecar/storage/proto; tests/test_architecture.py holds them to it), so an answer
that carries them verbatim is built by concatenating encodings instead of building messages: on
a 32k-token window that saves ~1.5 us per entry (benchmarks/ measures the call). Protobuf allows
it: fields may come in any order, and the occurrences of a repeated field concatenate.

An answer built here is :data:`Encoded`: a servicer method that returns one says so in its
annotation, and :func:`serialize` sends it as it is.
"""

from __future__ import annotations

from typing import NewType

from context_sidecar_client.v1 import sidecar_pb2 as pb
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from sidecar.memory.api import MemoryList
from sidecar.transcript.transcripts import AppendResult, AssembledContext
from sidecar.wire import messages

# An answer already serialized: the bytes of a whole response message, sent as they are.
Encoded = NewType("Encoded", bytes)


def _field_alone(message_type: type[message.Message], field_name: str,
                 as_repeated_bytes: bool) -> type[message.Message]:
    """A message type holding only ``message_type.field_name`` (same number): serialising it
    gives exactly that field's encoding, so protobuf itself splices pre-encoded messages.

    ``as_repeated_bytes``: the field becomes ``repeated bytes``, which frames already-encoded
    submessages exactly as the real repeated message field would (same tag, same length
    prefix). Otherwise the field keeps its own scalar type: its encoding appended to a stored
    message sets that one field."""
    real = message_type.DESCRIPTOR.fields_by_name[field_name]
    name = f"{message_type.DESCRIPTOR.name}{real.camelcase_name[0].upper()}{real.camelcase_name[1:]}Alone"
    file = descriptor_pb2.FileDescriptorProto(name=f"contextsidecar/splice/{name}.proto",
                                              package="contextsidecar.splice", syntax="proto3")
    kind = descriptor_pb2.FieldDescriptorProto
    file.message_type.add(name=name).field.add(
        name=real.name, number=real.number, type=kind.TYPE_BYTES if as_repeated_bytes else real.type,
        label=kind.LABEL_REPEATED if as_repeated_bytes else kind.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"contextsidecar.splice.{name}"))


_EntriesAsBytes = _field_alone(pb.AssembleContextResponse, "entries", as_repeated_bytes=True)
_MemoriesAsBytes = _field_alone(pb.ListMemoryResponse, "entries", as_repeated_bytes=True)
_ScoreAlone = _field_alone(pb.MemoryEntry, "score", as_repeated_bytes=False)


def memory_list(listed: MemoryList) -> Encoded:
    """The serialized ListMemoryResponse, its entries spliced from stored records (each with
    its score appended in relevance answers)."""
    records = listed.records
    if listed.scores is not None:
        records = [record + _ScoreAlone(score=score).SerializeToString()
                   for record, score in zip(records, listed.scores)]
    head = pb.ListMemoryResponse(token_counter=listed.token_counter, tokens_used=listed.tokens_used,
                                 left_out_for_budget=listed.left_out_for_budget, rank=listed.rank,
                                 left_out_for_size=listed.left_out_for_size)
    return Encoded(head.SerializeToString() + _MemoriesAsBytes(entries=records).SerializeToString())


def memory_entry(record: bytes) -> Encoded:
    """A stored memory record is a serialized MemoryEntry, the whole of GetMemory's answer."""
    return Encoded(record)


def assembled(assembly: AssembledContext, appended: list[AppendResult]) -> Encoded:
    """The serialized AssembleContextResponse: its scalar fields, then the entries spliced in
    (unless a rendering carries them). A re-assembly's (nothing appended) is kept with the
    answer, so an answer kept to be given again (``transcript.reassembly``) is encoded once."""
    if appended:
        return _assembled(assembly, appended)
    if not assembly.encoded:
        assembly.encoded.append(_assembled(assembly, appended))
    return Encoded(assembly.encoded[0])


def _assembled(assembly: AssembledContext, appended: list[AppendResult]) -> Encoded:
    window = assembly.window
    entries = window.records if not assembly.rendered else []
    if window.clips and entries:
        entries = list(entries)
        for position, clip in window.clips.items():
            entry = pb.WindowEntry.FromString(entries[position])
            entry.text, entry.tokens, entry.clipped_from_tokens = clip.text, clip.tokens, clip.original_tokens
            entries[position] = entry.SerializeToString()
    head = pb.AssembleContextResponse(
        run_id=window.run_id, iteration=window.iteration, token_counter=window.token_counter,
        token_budget=window.token_budget, token_count=window.token_count, event_ids=window.event_ids,
        omitted_events=window.omitted_events, summarized_events=window.summarized_events,
        appended=messages.appended_to(appended),
        compaction=pb.Compaction(due=window.compaction.due, candidate_event_ids=window.compaction.candidate_ids,
                                 tokens_before=window.compaction.tokens_before, reason=window.compaction.reason),
        sections=[messages.section_to(s) for s in assembly.sections], prefix_sha256=assembly.prefix_sha256,
        prefix_changed=assembly.prefix_changed, window_tokens=assembly.window_tokens,
        tools_tokens=assembly.tools_tokens, turn_limit_tokens=assembly.turn_limit, task_id=assembly.task_id,
        rendered=assembly.rendered, cache=messages.cache_report_to(assembly.cache))
    # Fields may come in any order in protobuf's encoding; repeated ones concatenate.
    return Encoded(head.SerializeToString() + _EntriesAsBytes(entries=entries).SerializeToString())


def serialize(response: message.Message | Encoded) -> bytes:
    """The response serializer of every method: an :data:`Encoded` answer goes out as it is."""
    return response if isinstance(response, bytes) else response.SerializeToString()
