"""The sizes an entry and a gRPC message may have, apart from the transport so that options and commands that
check them do not import gRPC."""

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_ENTRY_BYTES = 8 * 1024 * 1024   # a storage node's default --max-entry-bytes
MAX_SENDABLE_ENTRY_BYTES = MAX_MESSAGE_BYTES - 64 * 1024   # an entry larger travels in no message (its add's
                                                           # ids, key and digest take far less than the margin)
