"""Secrets in the configuration: no guessable admin token, no password printed.

The admin API lists every scope's receipts. A shipped compose file that fell
back to `change-me` exposed it to any host on the network: the gateway now
refuses a short or placeholder token at start, and no shipped file carries a
default.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import AdminSettings, load_settings, render_effective
from gateway.engine.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "token", ["change-me", "CHANGEME", "admin", "secret", "password", "a" * 23, "adm1n"]
)
def test_a_short_or_placeholder_admin_token_is_refused(tmp_path: Path, token: str) -> None:
    """The refusal names the key and says why; it never echoes the token."""
    path = tmp_path / "gateway.toml"
    path.write_text(f'[admin]\ntoken = "{token}"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(path, environ={})
    message = str(refused.value)
    assert "admin.token" in message
    assert "24" in message or "placeholder" in message
    assert f"'{token}'" not in message
    assert f'"{token}"' not in message


@pytest.mark.parametrize(
    "token",
    [
        "aaaaaaaaaaaaaaaaaaaaaaaa",
        "123456789012345678901234",
        "adminadminadminadminadmin",
        "abcdefghijklmnopqrstuvwxyz",
        "9876543210987654321098765",
        "abababababababababababbaba",
    ],
)
def test_a_long_but_guessable_admin_token_is_refused(tmp_path: Path, token: str) -> None:
    """Long is not enough (security review, finding 6): a character or a short pattern
    repeated, characters in sequence, or few different characters are refused, without
    the token in the message, which points at `idempotency-gateway token`."""
    path = tmp_path / "gateway.toml"
    path.write_text(f'[admin]\ntoken = "{token}"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(path, environ={})
    message = str(refused.value)
    assert "admin.token" in message
    assert "guessable" in message
    assert "idempotency-gateway token" in message
    assert token not in message


def test_the_token_command_prints_a_token_the_gateway_accepts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """256 random bits, URL-safe, a new one each time, and accepted as the admin token."""
    from gateway.cli import main

    printed = []
    for _ in range(2):
        assert main(["token"]) == 0
        printed.append(capsys.readouterr().out.strip())
    assert printed[0] != printed[1]
    for token in printed:
        assert len(token) == 43
        assert AdminSettings(token=token).enabled


def test_a_long_random_admin_token_is_accepted() -> None:
    """24 characters or more that are not a placeholder enable the admin API."""
    assert AdminSettings(token="Zq4-7hL2pW9xR1vT8mK3nB6c").enabled
    assert not AdminSettings(token="").enabled  # empty: admin endpoints disabled


def test_the_compose_file_will_not_start_without_a_token() -> None:
    """`${ADMIN_TOKEN:?...}`: compose itself refuses to start when it is unset."""
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    token = compose["x-gateway"]["environment"]["IDEMPOTENCY_GATEWAY_ADMIN__TOKEN"]
    assert token.startswith("${ADMIN_TOKEN:?"), token
    assert "change-me" not in (ROOT / "deploy" / "compose.yaml").read_text()


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql://gw:pw-in-userinfo@db:5432/db", "pw-in-userinfo"),
        ("postgresql://gw@db:5432/db?password=pw-in-query&sslmode=require", "pw-in-query"),
        ("postgresql://gw@db/db?sslpassword=key-pass&application_name=x", "key-pass"),
        ("postgresql://gw@db/db?PASSWORD=upper-case", "upper-case"),
    ],
)
def test_check_config_masks_every_password_in_the_store_url(
    tmp_path: Path, url: str, secret: str
) -> None:
    """check-config prints the store URL without any password, in userinfo or query
    (security review, finding 15)."""
    path = tmp_path / "gateway.toml"
    path.write_text(f'[store]\nurl = "{url}"\n')
    rendered = render_effective(load_settings(path, environ={}))
    assert secret not in rendered
    assert "***" in rendered


def test_an_admin_listener_on_the_main_port_is_refused(tmp_path: Path) -> None:
    """Listeners are told apart by address and port: one port for both is refused, even on
    another address (security review, finding 8)."""
    path = tmp_path / "gateway.toml"
    token = 'token = "Zq4-7hL2pW9xR1vT8mK3nB6c"\n'
    for admin in ('host = "127.0.0.2"\nport = 8080\n', 'listen = "127.0.0.2:8080"\n'):
        path.write_text(f'[server]\nhost = "127.0.0.1"\nport = 8080\n[admin]\n{token}{admin}')
        with pytest.raises(ConfigError) as refused:
            load_settings(path, environ={})
        assert "admin.port: is the main listener's port 8080" in str(refused.value)
    path.write_text(f"[server]\nport = 0\n[admin]\n{token}port = 0\n")
    assert load_settings(path, environ={}).admin.port == 0
    # A disabled admin API has no listener: its port cannot clash with anything.
    path.write_text("[server]\nport = 8081\n")
    assert load_settings(path, environ={}).server.port == 8081


def test_a_refused_upstream_url_is_named_without_its_query(tmp_path: Path) -> None:
    """A start-up refusal says what is wrong, never what may be a secret in the value
    (security review, finding 8): an upstream's query (`?token=...`) is not echoed."""
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[[routes]]\nname = "t"\nprefix = "/t"\n'
        'upstream = "http://gw:pw@127.0.0.1:9000/v1?token=SEKRIT-query-value#SEKRIT-frag"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_settings(path, environ={})
    message = str(refused.value)
    assert "routes[0].upstream" in message
    assert "SEKRIT" not in message
    assert ":pw@" not in message
