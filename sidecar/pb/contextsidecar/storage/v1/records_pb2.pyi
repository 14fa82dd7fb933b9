from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EventRecord(_message.Message):
    __slots__ = ("event_id", "seq", "iteration", "role", "type", "call_id", "content", "tokens", "tool_name")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    seq: int
    iteration: int
    role: str
    type: str
    call_id: str
    content: str
    tokens: int
    tool_name: str
    def __init__(self, event_id: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., role: _Optional[str] = ..., type: _Optional[str] = ..., call_id: _Optional[str] = ..., content: _Optional[str] = ..., tokens: _Optional[int] = ..., tool_name: _Optional[str] = ...) -> None: ...
