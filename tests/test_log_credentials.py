"""No credential reaches the log, however malformed the request (security review, finding 2).

aiohttp's parser refuses a malformed header line with a traceback whose message
quotes the raw line: five of five malformed `Authorization` lines (a trailing
CR from a Windows env file, a bare LF, DEL, NUL, a space before the colon)
wrote the token into the gateway's log, on the admin listener too. A gateway
started as in production (a subprocess, JSON logs at `info`) now logs such a
refusal as one line with the parser's reason and the peer. A fuzz target sends
malformed header lines carrying credential-shaped values and reads the whole
log afterwards.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
from harness import ADMIN_ENV, GatewayProcess, spawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rawhttp import address_of
from suite_profile import examples

TOKEN = "tok-SECRET-9f8e7d6c5b4a3f2e"
CLOSED_UPSTREAM = "http://127.0.0.1:9"
"""Nothing listens there: a request that parses is refused or unreachable, never sent."""

VARIANTS = {
    "a trailing CR (a Windows env file)": b"Authorization: Bearer %s\r\r\n",
    "a bare LF": b"Authorization: Bearer %s\n",
    "DEL": b"Authorization: Bearer %s\x7f\r\n",
    "NUL": b"Authorization: Bearer %s\x00\r\n",
    "a space before the colon": b"Authorization : Bearer %s\r\n",
}


def _send(address: tuple[str, int], header_line: bytes) -> bytes:
    """One raw request carrying `header_line`; the answer's first bytes (or b"")."""
    raw = (
        b"POST /tickets/v1/issues HTTP/1.1\r\nHost: gateway.test\r\n"
        + header_line
        + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(address, timeout=10) as connection:
        connection.sendall(raw)
        try:
            return connection.recv(4096)
        except (ConnectionResetError, TimeoutError):
            return b""


def _gateway(processes: list[GatewayProcess], tmp_path: Path) -> GatewayProcess:
    return spawn(
        processes,
        tmp_path,
        CLOSED_UPSTREAM,
        env=ADMIN_ENV,
        logging={"level": "info", "format": "json"},
    )


def _log_lines(gateway: GatewayProcess) -> list[dict[str, object]]:
    assert gateway.log_path is not None
    return [json.loads(line) for line in gateway.log_path.read_text().splitlines() if line]


@pytest.mark.parametrize("listener", ["main", "admin"])
def test_a_malformed_authorization_line_is_logged_without_its_token(
    processes: list[GatewayProcess], tmp_path: Path, listener: str
) -> None:
    gateway = _gateway(processes, tmp_path)
    url = gateway.url if listener == "main" else gateway.admin_url
    assert url is not None
    for shape in VARIANTS.values():
        answer = _send(address_of(url), shape % TOKEN.encode())
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    gateway.stop()  # every line flushed
    assert gateway.log_path is not None
    text = gateway.log_path.read_text()
    assert TOKEN not in text
    assert "Traceback" not in text
    refused = [line for line in _log_lines(gateway) if line.get("event") == "malformed_request"]
    assert len(refused) == len(VARIANTS)
    for line in refused:
        assert line["level"] == "warning"
        assert "127.0.0.1" in str(line["message"])


_CREDENTIAL = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=16, max_size=40
)
_NAME = st.sampled_from(
    [b"Authorization", b"Proxy-Authorization", b"X-Api-Key", b"Cookie", b"Auth\x7forization"]
)
_SEPARATOR = st.sampled_from([b": ", b" : ", b":\t", b"::", b":", b"\t: "])
_SCHEME = st.sampled_from([b"Bearer ", b"Basic ", b"", b"Bearer\t", b"token="])
_JUNK = st.binary(min_size=0, max_size=3).map(
    lambda raw: bytes(b if b in (0, 9, 10, 13, 127) or b >= 128 else b % 32 for b in raw)
)
_ENDING = st.sampled_from([b"\r\n", b"\n", b"\r\r\n", b"\r \r\n", b"\x00\r\n"])


def test_fuzz_malformed_header_lines_never_put_a_credential_in_the_log(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """Header lines of every malformed shape, each carrying a fresh credential-shaped
    value, against one gateway; afterwards the log holds none of them."""
    gateway = _gateway(processes, tmp_path)
    address = address_of(gateway.url)
    sent: list[str] = []

    @settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
    @given(_NAME, _SEPARATOR, _SCHEME, _CREDENTIAL, _JUNK, _ENDING, st.booleans())
    def send_one(
        name: bytes,
        separator: bytes,
        scheme: bytes,
        credential: str,
        junk: bytes,
        ending: bytes,
        junk_first: bool,
    ) -> None:
        value = junk + credential.encode() if junk_first else credential.encode() + junk
        sent.append(credential)
        _send(address, name + separator + scheme + value + ending)

    send_one()
    gateway.stop()
    assert gateway.log_path is not None
    text = gateway.log_path.read_text()
    assert "Traceback" not in text
    leaked = [credential for credential in set(sent) if credential in text]
    assert not leaked, f"{len(leaked)} credentials in the log, e.g. {leaked[0]!r}"


def test_refusals_are_rate_limited_and_say_how_many_were_left_out() -> None:
    """A flood of malformed requests is not a flood of log lines: at most
    `PARSER_LINES_PER_SECOND` a second, and none of them quotes the request."""
    from aiohttp.http_exceptions import BadHttpMessage

    from gateway.web.logs import PARSER_LINES_PER_SECOND, MalformedRequestFilter

    def record() -> logging.LogRecord:
        error = BadHttpMessage("\n  Invalid header value char:\n\n  b'Bearer " + TOKEN + "'")
        return logging.LogRecord(
            "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
            ("127.0.0.1",), (BadHttpMessage, error, None),
        )  # fmt: skip

    quiet = MalformedRequestFilter()
    kept = [r for r in (record() for _ in range(3 * PARSER_LINES_PER_SECOND)) if quiet.filter(r)]
    assert PARSER_LINES_PER_SECOND <= len(kept) <= 2 * PARSER_LINES_PER_SECOND  # a second may turn
    assert all(TOKEN not in r.getMessage() and r.exc_info is None for r in kept)
    other = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "other", (), None)
    assert quiet.filter(other)  # anything else passes untouched
