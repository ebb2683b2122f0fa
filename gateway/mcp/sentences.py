"""The one sentence a model reads when the gateway answers a tool call itself.

A model acts on the words, not on `_meta`: "refused" reads as "nothing
happened, try again", and a model told so about a call that may have taken
effect retries it under a new key, which is the duplicate the gateway exists
to prevent. So every problem type has its own sentence, and each says only
what is true of every call answered with that type:

- the outcome is unknown (`upstream-timeout`, `upstream-connection-lost`,
  `outcome-unknown`): the tool may have done it; it must not be called again,
  under this key or a new one; it can be looked up;
- the call was not made (a saturated route, a store that is down, a quota...):
  it is safe to retry with the same key;
- the call took effect earlier (`receipt-expired`, `receipt-not-retained`):
  it will not run again;
- the request is wrong (a key reused for other arguments, a bad key...): fix it.

None of them suggests a way around the guard (forcing, a "distinct" marker):
those are for the people who write agents, not for the model.
"""

from __future__ import annotations

__all__ = [
    "PROBED_SENTENCE",
    "SENTENCES",
    "SERVER_CANCELLED_SENTENCE",
    "UNKNOWN_OUTCOME_TYPES",
    "sentence_for",
    "similar_sentence",
]

PROBED_SENTENCE = (
    "This call took effect: its answer was lost, and the gateway confirmed the effect by "
    "asking the tool's server. The tool's own result is not available. Do not call it again."
)
"""The receipt a probe made (`gateway.mcp.probe`): the effect exists, its answer does not."""

_MAY_HAVE = (
    "The tool may have done what was asked. Do not call it again, not under this key and "
    "not under a new one: look the call up with its key (or ask the user or an operator "
    "to check the tool) until its outcome is settled."
)

SERVER_CANCELLED_SENTENCE = (
    "The tool's server cancelled this call while it ran, without saying whether it had "
    f"already done what was asked. {_MAY_HAVE}"
)
"""What the caller whose call the server cancelled (`-32800`) reads; its type is
`outcome-unknown`, whose own sentence is a retry's ("An earlier attempt...")."""

UNKNOWN_OUTCOME_TYPES = frozenset(
    {"upstream-timeout", "upstream-connection-lost", "outcome-unknown"}
)
"""Problem types that say: the call was sent and nobody knows whether it took effect."""

SENTENCES: dict[str, str] = {
    # The outcome is unknown: sent, and no answer says whether it ran.
    "upstream-timeout": f"The tool did not answer in time. {_MAY_HAVE}",
    "upstream-connection-lost": (
        f"The connection to the tool broke before its answer arrived. {_MAY_HAVE}"
    ),
    "outcome-unknown": (
        f"An earlier attempt of this call was sent and no answer says whether it ran. {_MAY_HAVE}"
    ),
    # Waiting on an attempt still running.
    "in-progress": (
        "An earlier attempt of this exact call is still running. Wait, then retry the same "
        "call with the same key to get its result."
    ),
    # It took effect earlier.
    "receipt-expired": (
        "This call already took effect earlier, and its stored result has expired; it will "
        "not be run again. Look it up instead of retrying."
    ),
    "receipt-not-retained": (
        "This call already took effect earlier, and its result was not kept; it will not be "
        "run again. Look it up instead of retrying."
    ),
    # Not made: nothing reached the tool.
    "upstream-unreachable": (
        "The tool could not be reached, so the call was not made. Retry it with the same key."
    ),
    "store-unavailable": (
        "The gateway could not record this call, so it was not made. Retry it with the same "
        "key in a moment."
    ),
    "route-saturated": (
        "The tool is busy with too many calls, so this one was not made. Retry it with the "
        "same key after a short wait."
    ),
    "lease-lost": (
        "The gateway lost its hold on this call before sending it, so it was not made. Retry "
        "it with the same key."
    ),
    "quota-exceeded": (
        "This client is over its quota, so the call was not made. Retry it with the same key later."
    ),
    "request-timeout": (
        "The call did not arrive in time, so it was not made. Retry it with the same key."
    ),
    # The request is wrong: fix it.
    "key-mismatch": (
        "This idempotency key was already used for a different tool call. Use a new key "
        "for a new call; the earlier call's key cannot be reused for other arguments."
    ),
    # The key's first call is still open: the two calls may mean one effect.
    "key-mismatch-unsettled": (
        "This idempotency key was already used for a call with other arguments, and that "
        "earlier call may have taken effect: its outcome is not settled yet. Do not call "
        "it again, not under this key and not under a new one; look the earlier call up "
        "with its key until its outcome is settled."
    ),
    "missing-key": (
        "This tool needs an idempotency key, so the call was not made. Send it again with "
        "one in _meta.idempotencyKey."
    ),
    "invalid-key": (
        "The idempotency key is not valid, so the call was not made. Send it again with a "
        "valid key."
    ),
    "invalid-request": "The call is malformed, so it was not made. Fix it before sending it.",
    "bad-request": "The call is malformed, so it was not made. Fix it before sending it.",
    "payload-too-large": (
        "The call is larger than this tool accepts, so it was not made. Send less."
    ),
    "unsupported-transfer-coding": (
        "The call was sent in an encoding the gateway does not accept, so it was not made."
    ),
    "missing-credentials": (
        "The call carried no credentials, so it was not made. It needs the client's token."
    ),
    "unauthorized": (
        "The call's credentials were not accepted, so it was not made. It needs a valid token."
    ),
    "client-not-allowed": "This client may not use this tool, so the call was not made.",
    "role-forbidden": "This token's role may not do this, so nothing was made.",
    "method-not-allowed": "The gateway does not take this kind of request here; nothing was made.",
    "not-found": "Nothing is known here under that name; nothing was made.",
    "no-route": "No tool server is configured at this address; nothing was made.",
    "unknown-key": "No call with this key is known in this client's scope.",
    # Operator-side answers: not a tool call's, but each has its sentence all the same.
    "not-resolvable": "Only a call whose outcome is unknown can be settled; this one is not.",
    "precondition-failed": "The call's record changed since it was read; read it again.",
    # The same call under another key, not settled: the model most likely lost the key.
    "similar-operation": (
        "This exact call, with the same arguments, was already made under another key and "
        "has not finished or its outcome is unknown, so this one was not made: it could do "
        "the same thing twice. Do not call it again, not under this key and not under a new "
        "one: look the earlier call up with its key until its outcome is settled."
    ),
    "too-early": (
        "The tool may still be applying this call's last attempt, so it is too early to "
        "settle the call as not applied. Do not call it again; check the tool again after "
        "the time given."
    ),
    "invalid-config": "The gateway's configuration is invalid; nothing was made.",
    # The gateway's own failure, or an upstream failure with no finer type: sent or not,
    # nobody can say, so it reads as an unknown outcome.
    "upstream-error": f"The tool's server failed while handling the call. {_MAY_HAVE}",
    "internal-error": f"The gateway failed while handling the call. {_MAY_HAVE}",
}


def sentence_for(problem_type: str) -> str:
    """The sentence for a problem type (`key-mismatch`, or its full type URI).

    >>> sentence_for("https://idempotency-gateway.dev/problems/upstream-timeout").startswith(
    ...     "The tool did not answer in time")
    True
    """
    kind = problem_type.rsplit("/", 1)[-1]
    return SENTENCES.get(kind, SENTENCES["internal-error"])


def similar_sentence(twin_key: str, status_tool: str | None, state: str | None = None) -> str:
    """The `similar-operation` sentence, naming the earlier call's key (and the route's
    status tool, when it has one): what the model must look up instead of calling again.
    What it says of the earlier call follows that call's `state` now: a refusal repeated
    after it completed says it took effect, not that it may still be running.

    >>> similar_sentence("run-7:0:c1", "operation_status").endswith(
    ...     'the tool operation_status with key "run-7:0:c1".')
    True
    >>> "already took effect" in similar_sentence("run-7:0:c1", None, "completed")
    True
    """
    how = f"the tool {status_tool} with key" if status_tool else "its key,"
    if state == "completed":
        return (
            "This exact call, with the same arguments, was already made under another key "
            f'("{twin_key}") and already took effect, so this one was not made: it would do '
            "the same thing twice. Do not call it again, not under this key and not under a "
            f'new one. Get the earlier call\'s result with {how} "{twin_key}".'
        )
    return (
        "This exact call, with the same arguments, was already made under another key "
        f'("{twin_key}") and has not finished or its outcome is unknown, so this one was not '
        "made: it could do the same thing twice. Do not call it again, not under this key and "
        f'not under a new one. Look the earlier call up with {how} "{twin_key}".'
    )
