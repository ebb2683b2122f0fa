"""Property tests: whatever values a config holds, loading fails only with a ConfigError
that names the key, never with a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suite_profile import examples

from gateway.config import Settings, load_settings
from gateway.engine.errors import ConfigError

KEYS = [
    "server.port",
    "server.host",
    "server.client_timeout",
    "store.url",
    "store.busy_timeout",
    "store.encryption_keys",
    "idempotency.retention",
    "idempotency.tombstone_retention",
    "idempotency.lease",
    "idempotency.scope_headers",
    "admin.token",
    "admin.host",
    "admin.port",
    "quotas.new_keys_per_minute",
    "routes.0.prefix",
    "routes.0.upstream",
    "routes.0.timeout",
    "routes.0.max_body",
    "routes.0.methods",
    "routes.0.forward_key",
    "routes.0.release_statuses",
]

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4),
    max_leaves=6,
)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(key=st.sampled_from(KEYS), value=values)
def test_any_value_loads_or_is_refused_naming_its_key(tmp_path: Path, key: str, value: Any) -> None:
    """Any value for a known key gives Settings or a ConfigError naming that key."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[routes]]\nname = "tickets"\nprefix = "/tickets"\nupstream = "http://127.0.0.1:9000"\n'
    )
    refusal: str | None = None
    try:
        loaded = load_settings(config, overrides={key: value}, environ={})
    except ConfigError as exc:
        refusal = exc.detail
    if refusal is None:
        assert isinstance(loaded, Settings)
        return
    section, _, rest = key.partition(".")
    # A cross-field rule (tombstone_retention >= retention) may name the sibling key.
    named = f"routes[0].{rest.split('.', 1)[1]}" if section == "routes" else f"{section}."
    assert named in refusal, refusal
