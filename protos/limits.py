"""Limits of the wire protocol that both ends know (storage_node and connector never import each other,
DESIGN section 2)."""

MAX_WAIT_LAC_MS = 120_000   # the longest WaitLac a node takes; the client asks again for a longer wait
