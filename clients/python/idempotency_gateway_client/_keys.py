"""One stable key per effect: `run_id:turn:call_id`.

A key names an effect, not an attempt: every retry of the same tool call, in
this process or after a restart, must send the same key, or the gateway sees
a new effect. So the key is derived from what the journal already holds (the
run id, the turn number, the model's call id) and never from a clock or a
random number.
"""

from __future__ import annotations

from urllib.parse import quote

from idempotency_gateway_client._exceptions import KeyFormatError

__all__ = ["MAX_KEY_LENGTH", "derive_key", "operation_path", "validate_key"]

MAX_KEY_LENGTH = 255
"""The gateway's limit, in characters (keys are ASCII, so also bytes)."""


def validate_key(key: str) -> str:
    """Return `key` if the gateway would accept it: 1 to 255 printable ASCII characters,
    with no space at either end (HTTP strips a header value's outer whitespace, so the
    gateway refuses such a key rather than name one effect by two spellings).

    >>> validate_key("run-77:0:c1")
    'run-77:0:c1'
    """
    if not key:
        raise KeyFormatError("an idempotency key may not be empty")
    for position, char in enumerate(key):
        if not " " <= char <= "~":
            raise KeyFormatError(
                f"an idempotency key is printable ASCII; {char!r} at position {position} is not"
            )
    if len(key) > MAX_KEY_LENGTH:
        raise KeyFormatError(
            f"an idempotency key is at most {MAX_KEY_LENGTH} characters; this one has {len(key)}"
        )
    if key.strip(" ") != key:
        raise KeyFormatError(
            "an idempotency key may not start or end with a space: HTTP strips it from the "
            "header, so the gateway refuses such a key"
        )
    return key


def derive_key(run_id: str, turn: int, call_id: str) -> str:
    """The key of one tool call: `run_id:turn:call_id`, the same on every retry.

    `run_id` may not contain `:` (so two different triples never give the same
    key); `call_id` is the model's id for the call (`call_abc`, `toolu_01...`).

    >>> derive_key("run-77", 0, "c1")
    'run-77:0:c1'
    """
    if not run_id:
        raise KeyFormatError("run_id may not be empty")
    if ":" in run_id:
        raise KeyFormatError(f"run_id may not contain ':' (got {run_id!r}); it separates the parts")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise KeyFormatError(f"turn must be an integer >= 0, got {turn!r}")
    if not call_id:
        raise KeyFormatError("call_id may not be empty")
    return validate_key(f"{run_id}:{turn}:{call_id}")


def operation_path(key: str) -> str:
    """The lookup path of a key: `/operations/` and the key as one percent-encoded segment.

    >>> operation_path("run-77:0:c1/x")
    '/operations/run-77%3A0%3Ac1%2Fx'
    """
    return "/operations/" + quote(key, safe="")
