"""The JSON-RPC response in an MCP answer, whichever way it came.

A Streamable HTTP server answers a POST with one JSON body or with an event
stream whose `data:` lines carry messages (requests and notifications of its
own may come first). The load generators only need the response.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["response_in"]


def response_in(body: bytes, call_id: object = None) -> dict[str, Any] | None:
    """The first JSON-RPC response (a result or an error, not a request or a notification)
    in a JSON or event-stream body, to `call_id` when one is given; None when there is none.

    >>> response_in(b'{"jsonrpc":"2.0","id":1,"result":{}}')
    {'jsonrpc': '2.0', 'id': 1, 'result': {}}
    >>> response_in(b'data: {"method":"ping","id":9}\\n\\ndata: {"id":1,"error":{}}\\n\\n', 1)
    {'id': 1, 'error': {}}
    >>> response_in(b"Bad Gateway") is None
    True
    """
    text = body.decode("utf-8", "replace")
    events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for data in events or [text]:
        try:
            message = json.loads(data)
        except ValueError:
            continue
        if (
            isinstance(message, dict)
            and "method" not in message
            and ("result" in message or "error" in message)
            and (call_id is None or message.get("id") == call_id)
        ):
            return message
    return None
