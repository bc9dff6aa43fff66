from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNKNOWN: _ClassVar[Status]
    OK: _ClassVar[Status]
    NO_LEDGER: _ClassVar[Status]
    NO_ENTRY: _ClassVar[Status]
    FENCED: _ClassVar[Status]
    UNAUTHORIZED: _ClassVar[Status]
    READ_ONLY: _ClassVar[Status]
    BAD_REQUEST: _ClassVar[Status]
    ERROR: _ClassVar[Status]
    TOO_LARGE: _ClassVar[Status]

class AddFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADD_FLAG_NONE: _ClassVar[AddFlag]
    RECOVERY_ADD: _ClassVar[AddFlag]
STATUS_UNKNOWN: Status
OK: Status
NO_LEDGER: Status
NO_ENTRY: Status
FENCED: Status
UNAUTHORIZED: Status
READ_ONLY: Status
BAD_REQUEST: Status
ERROR: Status
TOO_LARGE: Status
ADD_FLAG_NONE: AddFlag
RECOVERY_ADD: AddFlag

class AddEntry(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "master_key", "flags", "last_add_confirmed", "payload", "digest")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    master_key: bytes
    flags: int
    last_add_confirmed: int
    payload: bytes
    digest: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., flags: _Optional[int] = ..., last_add_confirmed: _Optional[int] = ..., payload: _Optional[bytes] = ..., digest: _Optional[int] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("entries", "range_results")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    RANGE_RESULTS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AddEntry]
    range_results: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[AddEntry, _Mapping]]] = ..., range_results: _Optional[bool] = ...) -> None: ...

class AddResult(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "status", "message")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    status: Status
    message: str
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AddRange(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "status", "message")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    status: Status
    message: str
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("results", "ranges")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AddResult]
    ranges: _containers.RepeatedCompositeFieldContainer[AddRange]
    def __init__(self, results: _Optional[_Iterable[_Union[AddResult, _Mapping]]] = ..., ranges: _Optional[_Iterable[_Union[AddRange, _Mapping]]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "fence", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    fence: bool
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., fence: _Optional[bool] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("status", "message", "ledger_id", "entry_id", "last_add_confirmed", "payload", "digest")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    payload: bytes
    digest: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., last_add_confirmed: _Optional[int] = ..., payload: _Optional[bytes] = ..., digest: _Optional[int] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "fence", "master_key", "max_bytes_per_message")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    fence: bool
    master_key: bytes
    max_bytes_per_message: int
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., fence: _Optional[bool] = ..., master_key: _Optional[bytes] = ..., max_bytes_per_message: _Optional[int] = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("status", "message", "entries", "done")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    entries: _containers.RepeatedCompositeFieldContainer[ReadResponse]
    done: bool
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[ReadResponse, _Mapping]]] = ..., done: _Optional[bool] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id", "fence", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    fence: bool
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., fence: _Optional[bool] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "message", "last_entry_id", "last_add_confirmed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    last_entry_id: int
    last_add_confirmed: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., last_entry_id: _Optional[int] = ..., last_add_confirmed: _Optional[int] = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "master_key", "last_add_confirmed")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    LAST_ADD_CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    master_key: bytes
    last_add_confirmed: int
    def __init__(self, ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., last_add_confirmed: _Optional[int] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class WaitLacRequest(_message.Message):
    __slots__ = ("ledger_id", "previous_lac", "timeout_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    previous_lac: int
    timeout_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class NodeInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfoResponse(_message.Message):
    __slots__ = ("node_id", "address", "read_only", "disk_total_bytes", "disk_used_bytes", "ledger_count", "entry_count", "version", "max_entry_bytes", "journal_fsyncs", "journal_records", "read_only_reason", "max_request_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    DISK_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEDGER_COUNT_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRY_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FSYNCS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_RECORDS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_REASON_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    read_only: bool
    disk_total_bytes: int
    disk_used_bytes: int
    ledger_count: int
    entry_count: int
    version: str
    max_entry_bytes: int
    journal_fsyncs: int
    journal_records: int
    read_only_reason: str
    max_request_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., read_only: _Optional[bool] = ..., disk_total_bytes: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ..., ledger_count: _Optional[int] = ..., entry_count: _Optional[int] = ..., version: _Optional[str] = ..., max_entry_bytes: _Optional[int] = ..., journal_fsyncs: _Optional[int] = ..., journal_records: _Optional[int] = ..., read_only_reason: _Optional[str] = ..., max_request_bytes: _Optional[int] = ...) -> None: ...
