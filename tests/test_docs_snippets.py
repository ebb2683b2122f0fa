"""The docs' code blocks run, type-check and load as written, so the docs cannot drift.

Every fenced block in README.md and docs/*.md carries a marker on the line
before its fence (`<!-- snippet: run NAME -->`, `typecheck NAME`, `config`,
`json`, `output`, `text`, `skip: REASON`; tests/doc_snippets.py says what each
means); an unmarked block fails `test_every_block_is_classified`, naming its
file:line.

- `run` blocks run in a subprocess (60 s at most, killed at once when their
  tickets and emails run away) against what `make run` serves:
  config/gateway.toml's gateway in front of the example ticket API and MCP
  server, on free loopback ports (the blocks' :8080, :9000, :9100 are
  rewritten to them), from a temporary directory (`data/...` and `runs/...`
  land there). A shell block runs in one bash; every command must exit 0 (or
  the `(exit status N)` its shown output ends with), and the output shown in
  the comments under it must be printed by it, in order (`...`, `op_01...`:
  anything; a random run id `demo-b4f1c8`: any, the same everywhere in the
  block). A Python block is a whole program (imports, the names it uses,
  `async def main()`, a top-level `asyncio.run(main())`) and runs as written:
  nothing is put before or after it, as when a reader copies it into a file.
  The comment lines right under its last line of code are the output it
  prints, matched like a shell command's.
  A block whose HARNESS entry `serves` a `serve` block talks to that config's
  gateway instead (its upstreams the same servers).
  The model SDKs' clients, built as a user builds them (`AsyncOpenAI()`,
  `AsyncAnthropic()`), find a fake model API on loopback (FakeModel) in the
  environment (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL` and their keys); a
  lookup or connection anywhere else fails the block. HARNESS's checks then
  count the effects on the tool APIs.
- Python `run` and `typecheck` blocks, as written, are type-checked with
  `mypy --strict` against the installed SDKs: the project's own setting
  (`make typecheck`) and what a user with a typed code base runs on a copied
  snippet. Strict also checks the bodies of unannotated functions
  (--check-untyped-defs) and asks for the annotations that make the SDKs'
  types apply (`plan(turns: tuple[Turn, ...]) -> list[ToolCall]`).
- The TypeScript blocks of clients/typescript/README.md (marked the same way)
  are type-checked with tsc --strict against the built client, when it is
  built (make ts-build).
- `config` and `serve` blocks load with the gateway's own loader
  (`gateway.config.load_settings`), which refuses unknown keys; `json` blocks
  parse (`json journal`: as a run journal, with the client's model); JSON
  `output` samples parse as JSON with `...` placeholders.
- Each document has run ids of its own: a reader who runs README.md and then
  the docs against one `make run` gateway (one store, one scope) never sends a
  key another document bound to another request (`key-mismatch`).
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from doc_snippets import (
    LOOPBACK_GUARD,
    ROOT,
    Block,
    Command,
    FakeModel,
    MakeRun,
    Transcript,
    json_matches,
    make_run,
    parse_shell,
    read_blocks,
    run_ids,
    run_process,
    runs_itself,
    shell_script,
    shown_json,
    shown_output,
    split_transcript,
    stray_markers,
    subprocess_env,
)
from idempotency_gateway_client import JournalDocument
from mypy_cache import kept_mypy_cache

from gateway.config import load_settings
from gateway.engine.errors import ConfigError

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TS_README = ROOT / "clients" / "typescript" / "README.md"

"""What the TypeScript blocks leave to the reader (one line: errors keep their line)."""

SECONDS = 90.0
"""The longest one block may run (README's readme-slow waits for a 30 s timeout)."""


def all_blocks() -> list[Block]:
    return [block for path in [*DOCS, TS_README] for block in read_blocks(path)]


BLOCKS = all_blocks()


# --- What each run block needs, and what it must have done ---------------------------------------


@dataclass(frozen=True)
class Ran:
    """What a check sees once its block ran."""

    served: MakeRun
    model: FakeModel
    output: str

    @property
    def cwd(self) -> Path:
        return self.served.cwd

    @property
    def tickets_and_emails(self) -> tuple[int, int]:
        state = self.served.tool_state
        return len(state.issues), len(state.emails)

    def finished(self, journal: str) -> bool:
        return bool(json.loads((self.cwd / journal).read_text())["finished"])

    async def operation(self, key: str, headers: dict[str, str] | None = None) -> Any:
        url = f"{self.served.gateway_url}/operations/{quote(key, safe='')}"
        async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as got:
            assert got.status == 200, await got.text()
            return await got.json()


Check = Callable[[Ran], Awaitable[None]]
Setup = Callable[[MakeRun], Awaitable[None]]


@dataclass(frozen=True)
class Harness:
    setup: Setup | None = None
    check: Check | None = None
    after: str | None = None
    """Run on the servers of that block, right after it (the next step of a walk-through)."""
    not_run: tuple[str, ...] = ()
    """Shell: commands (by how they start) not run here; the harness says why in a comment."""
    needs: tuple[str, ...] = ()
    """Executables, or paths in the repository, without which the block is skipped."""
    max_effects: int = 10
    """More new tickets and emails than this: the block runs away; it is stopped."""
    admin_cli: bool = False
    """Shell: the CLI finds the admin listener and token as after `make run`'s `admin CLI:`
    line (its exported token; the listener's port, which is the test's, by environment)."""
    mypy_allows: tuple[str, ...] = ()
    """mypy errors (how the message starts) accepted in the block, the reason in a comment.
    One that no longer occurs fails the test, so that the allowance goes."""
    serves: str | None = None
    """The `serve` block whose config the gateway runs instead of config/gateway.toml
    (for this block and those that run after it)."""


async def check_cli(ran: Ran) -> None:
    """check-config printed the served config, masked; show found the walk-through's key."""
    assert 'name = "tickets"' in ran.output
    assert "run-77:0:c1" in ran.output
    assert "completed" in ran.output


def check_effects(tickets: int, emails: int, journal: str | None = None) -> Check:
    async def check(ran: Ran) -> None:
        assert ran.tickets_and_emails == (tickets, emails)
        if journal is not None:
            assert ran.finished(journal), f"{journal}: the run did not finish"

    return check


MCP_CREDENTIAL = {"Authorization": "Bearer agent-7-token"}
"""The credential docs/mcp.md's blocks send: their scope."""


async def check_slow(ran: Ran) -> None:
    """The late ticket is the only one the slow request made, and the probe's receipt."""
    assert ran.tickets_and_emails == (5, 3)
    operation = await ran.operation("slow-1:0:c1")
    assert (operation["state"], operation["attempts"]) == ("completed", 1)
    assert operation["receipt_source"] == "probe"
    [late] = [issue for issue in ran.served.tool_state.issues if issue.title == "Printer smoking"]
    assert late.idempotency_key == operation["id"]


async def check_slow_email(ran: Ran) -> None:
    """The email that timed out was sent once, never released by the tickets probe, and
    settled by the operator with the email the mail API sent."""
    assert ran.tickets_and_emails == (5, 4)
    operation = await ran.operation("slow-2:0:c1")
    assert (operation["state"], operation["attempts"]) == ("completed", 1)
    assert operation["resolution"]["by"] == "admin"
    probes = [event for event in operation["history"] if event["type"] == "probe"]
    assert probes
    assert all(event["verdict"] == "not-declared" for event in probes)


async def check_mcp_client(ran: Ran) -> None:
    [ticket] = ran.served.mcp_state.tickets
    operation = await ran.operation("run-mcp-1:0:c1", MCP_CREDENTIAL)
    assert ticket["idempotency_key"] == operation["id"]  # what the gateway forwarded
    lines = ran.output.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["1", "2"], ran.output
    assert lines[0].endswith(" None"), ran.output  # not replayed
    assert lines[1].endswith(" True"), ran.output  # replayed
    await _refused_without_credential(ran.served.gateway_url + "/mcp")
    await _transport_wide_key_mismatches(ran, ran.served.gateway_url + "/mcp")


async def _refused_without_credential(url: str) -> None:
    """What the doc says of the served config: no credential, no connection (401 and a
    JSON-RPC error carrying missing-credentials)."""
    from mcp_upstream import ACCEPT_BOTH, INITIALIZE

    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=INITIALIZE, headers=ACCEPT_BOTH) as response,
    ):
        assert response.status == 401, await response.text()
        answer = await response.json()
    assert answer["error"]["code"] == -32600, answer
    assert answer["error"]["data"]["type"].endswith("/missing-credentials"), answer


async def _transport_wide_key_mismatches(ran: Ran, url: str) -> None:
    """What the doc says of an Idempotency-Key on the SDK's HTTP client: the first tool
    call takes it, a later different call is key-mismatch; lists are not affected."""
    from mcp_upstream import mcp_client

    headers = {**MCP_CREDENTIAL, "Idempotency-Key": "transport-wide"}
    before = len(ran.served.mcp_state.tickets)
    async with mcp_client(url, headers=headers, mode="auto") as client:
        first = await client.call_tool("create_ticket", {"title": "first"})
        second = await client.call_tool("send_email", {"to": "ops@example.com", "subject": "x"})
        listed = await client.list_tools()
    assert not first.is_error
    assert second.is_error
    assert (second.meta or {})["idempotency"]["type"] == "key-mismatch", second
    assert "create_ticket" in {tool.name for tool in listed.tools}
    assert len(ran.served.mcp_state.tickets) == before + 1


async def check_mcp_generations(ran: Ran) -> None:
    lines = ran.output.splitlines()
    assert lines == [
        "auto 2026-07-28 completed",
        "legacy 2025-11-25 completed",
        "2026-07-28 2026-07-28 completed",
    ], ran.output


async def check_mcp_retry(ran: Ran) -> None:
    assert len(ran.served.mcp_state.tickets) == 1  # two calls, one key: one ticket


async def check_mcp_agent(ran: Ran) -> None:
    # readme-mcp's ticket, then the agent's ticket and email.
    assert (len(ran.served.mcp_state.tickets), len(ran.served.mcp_state.emails)) == (2, 1)
    assert ran.finished("data/agent-run-mcp.json")


async def check_mcp_run(ran: Ran) -> None:
    assert (len(ran.served.mcp_state.tickets), len(ran.served.mcp_state.emails)) == (1, 0)
    assert ran.finished("runs/run-agents-3.json")


async def check_http(ran: Ran) -> None:
    assert ran.tickets_and_emails == (1, 0)
    # Found in the scope of the block's credential, as its later lookups would be.
    operation = await ran.operation("run-agents-1:0:c1", {"Authorization": "Bearer <agent token>"})
    assert operation["state"] == "completed"


def check_model_loop(sdk: str, journal: str) -> Check:
    """The block's `Run` asked the model for the tool call, made it, gave the model its
    result, and finished with the model's answer."""

    async def check(ran: Ran) -> None:
        assert ran.tickets_and_emails == (1, 0)
        sent = [body for name, body in ran.model.requests if name == sdk]
        assert len(sent) == 2, sent  # the turn that calls the tool, then the final answer
        [ticket] = ran.served.tool_state.issues
        assert ticket.title == FakeModel.TITLE
        assert ticket.id in json.dumps(sent[1]["messages"][-1])  # the result went back
        assert ran.finished(journal)

    return check


async def check_langgraph(ran: Ran) -> None:
    assert ran.tickets_and_emails == (1, 0)  # the graph's call; its resume took the receipt
    operation = await ran.operation("run-agents-6:0:call_1")
    assert (operation["state"], operation["attempts"]) == ("completed", 1)
    assert "resumed: T-1" in ran.output


async def create_recovery_ticket(served: MakeRun) -> None:
    """The ticket docs/recovery.md's lookup finds: its agent's call, made before the crash."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{served.gateway_url}/tickets/v1/issues",
            json={"title": "Printer on fire"},
            headers={"Idempotency-Key": "run-recovery-1:0:c1"},
        ) as response,
    ):
        assert response.status == 201


async def check_lookup(ran: Ran) -> None:
    [answer] = [line for line in ran.output.splitlines() if line.startswith("{")]
    assert json.loads(answer)["state"] == "completed"


async def check_backup(ran: Ran) -> None:
    [backup] = (ran.cwd / "backup").glob("gateway-*.db")
    with sqlite3.connect(backup) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "operations" in tables


NEEDS_NODE_CLIENT = ("node", "clients/typescript/dist/index.js")  # make ts-build; make test has it

HARNESS: dict[str, Harness] = {
    # The README's blocks run as a reader meets them: in order, on one `make run`.
    "readme-walkthrough": Harness(check=check_effects(1, 0)),
    "readme-agent": Harness(
        after="readme-walkthrough", check=check_effects(2, 1, "data/agent-run.json")
    ),
    "readme-node": Harness(
        after="readme-agent",
        check=check_effects(3, 2, "data/agent-run-node.json"),
        # It installs and builds into the repository; the block needs its result.
        not_run=("make ts-build",),
        needs=NEEDS_NODE_CLIENT,
    ),
    "readme-cross-language": Harness(
        after="readme-node", check=check_effects(4, 3, "data/cross-run.json")
    ),
    "readme-mcp": Harness(after="readme-cross-language", check=check_mcp_retry),
    "readme-mcp-agent": Harness(after="readme-mcp", check=check_mcp_agent),
    "readme-mcp-stdio": Harness(after="readme-mcp-agent"),
    "readme-slow": Harness(after="readme-mcp-stdio", admin_cli=True, check=check_slow),
    "readme-slow-email": Harness(after="readme-slow", admin_cli=True, check=check_slow_email),
    "readme-cli": Harness(after="readme-slow-email", admin_cli=True, check=check_cli),
    "agents-http": Harness(check=check_http),
    "agents-run": Harness(check=check_effects(1, 1, "runs/run-agents-2.json"), max_effects=4),
    "agents-mcp": Harness(check=check_mcp_run),
    "agents-openai": Harness(check=check_model_loop("openai", "runs/run-agents-4.json")),
    "agents-anthropic": Harness(check=check_model_loop("anthropic", "runs/run-agents-5.json")),
    "agents-langgraph": Harness(check=check_langgraph),
    "mcp-client": Harness(
        serves="mcp-gateway",
        check=check_mcp_client,
        # The SDK's RequestParamsMeta is an open TypedDict (PEP 728 extra_items=Any): any
        # key is allowed, and pyright agrees. mypy does not implement extra_items yet and
        # reads it as closed (the client package casts for that reason: _mcp.py).
        mypy_allows=('Argument "meta" to "call_tool" of "Client" has incompatible type',),
    ),
    "mcp-generations": Harness(after="mcp-client", check=check_mcp_generations),
    "mcp-lookup": Harness(after="mcp-generations"),
    "recovery-lookup": Harness(setup=create_recovery_ticket, check=check_lookup),
    "deploy-sqlite-backup": Harness(check=check_backup, needs=("sqlite3",)),
}


# --- Every block is classified -------------------------------------------------------------------


def test_every_block_is_classified() -> None:
    problems: list[str] = []
    names: dict[str, Block] = {}
    for block in BLOCKS:
        what = f"```{block.lang} block ({block.first_line[:50]!r})"
        if block.marker_problem:
            problems.append(f"{block.where}: {block.marker_problem}")
        elif block.kind is None:
            problems.append(
                f"{block.where}: unclassified {what}: put <!-- snippet: KIND --> on the line "
                "before its fence (run NAME, typecheck NAME, config, json, output, text, "
                "skip: REASON; see tests/doc_snippets.py)"
            )
        elif block.kind in ("run", "typecheck"):
            if block.arg in names:
                problems.append(f"{block.where}: {block.arg!r} also names {names[block.arg].where}")
            names[block.arg] = block
            languages = ("python", "ts") if block.kind == "typecheck" else ("python", "sh", "bash")
            if block.lang not in languages:
                problems.append(f"{block.where}: {block.kind} of a {what}")
            elif block.lang != "ts" and block.arg not in HARNESS:
                problems.append(f"{block.where}: no entry {block.arg!r} in {__name__}.HARNESS")
        elif block.kind == "serve":
            if block.arg in names:
                problems.append(f"{block.where}: {block.arg!r} also names {names[block.arg].where}")
            names[block.arg] = block
            if block.lang != "toml":
                problems.append(f"{block.where}: serve of a {what}")
        elif block.kind == "config" and block.lang != "toml":
            problems.append(f"{block.where}: config of a {what}")
        elif block.kind == "json" and block.lang != "json":
            problems.append(f"{block.where}: json of a {what}")
        if (
            block.lang == "python"
            and block.kind in ("run", "typecheck")
            and not runs_itself(block.text)
        ):
            problems.append(
                f"{block.where}: not a whole program: imports, the names it uses, "
                "`async def main()` and a top-level `asyncio.run(main())`, so that it "
                "runs as written"
            )
    for path in [*DOCS, TS_README]:
        problems += [
            f"{path.relative_to(ROOT)}:{line}: a snippet marker that is not on the line right "
            "before a fence"
            for line in stray_markers(path)
        ]
    for name, harness in HARNESS.items():
        if name not in names:
            problems.append(f"HARNESS[{name!r}] has no block (renamed, or its marker gone?)")
        if harness.after is not None and harness.after not in names:
            problems.append(f"HARNESS[{name!r}] runs after {harness.after!r}: no such block")
        if harness.serves is not None and getattr(names.get(harness.serves), "kind", "") != "serve":
            problems.append(f"HARNESS[{name!r}] serves {harness.serves!r}: no such serve block")
        if harness.serves is not None and harness.after is not None:
            problems.append(f"HARNESS[{name!r}]: a block that runs after another is served by it")
    assert not problems, "\n".join(problems)


def test_each_document_has_its_own_run_ids() -> None:
    """A reader runs README.md and then the docs against one `make run` gateway: one store,
    and one scope for every block without a credential. A run id two documents use makes
    the second one's keys the first one's: a replayed receipt of another request, or
    `422 key-mismatch`. So the run ids of the blocks a reader runs (run, typecheck, and
    the skipped commands they run elsewhere: a resolve) are each in one document only."""
    used: dict[str, dict[Path, Block]] = {}
    for block in BLOCKS:
        if block.path in DOCS and block.kind in ("run", "typecheck", "skip"):
            for run_id in run_ids(block):
                used.setdefault(run_id, {}).setdefault(block.path, block)
    problems = [
        f"run id {run_id!r} in {len(where)} documents: "
        + ", ".join(block.where for block in where.values())
        + " (each document its own run ids: run-<document>-<n>)"
        for run_id, where in sorted(used.items())
        if len(where) > 1
    ]
    assert not problems, "\n".join(problems)


# --- config and JSON blocks ----------------------------------------------------------------------

CONFIG_BASES = {
    "route": (
        "# the minimal route a [routes.*] fragment belongs to\n"
        '[[routes]]\nname = "tickets"\nprefix = "/tickets"\nupstream = "http://127.0.0.1:9000"\n'
    ),
}
"""What a `<!-- snippet: config BASE -->` fragment is placed after."""


def blocks_of(kind: str, lang: str | None = None) -> list[Any]:
    return [
        pytest.param(block, id=block.where)
        for block in BLOCKS
        if block.kind == kind and lang in (None, block.lang)
    ]


@pytest.mark.parametrize("block", blocks_of("config") + blocks_of("serve"))
def test_config_block_loads(block: Block, tmp_path: Path) -> None:
    if block.kind == "config" and block.arg and block.arg not in CONFIG_BASES:
        pytest.fail(f"{block.where}: no config base {block.arg!r} ({list(CONFIG_BASES)})")
    path = tmp_path / "gateway.toml"
    base = CONFIG_BASES.get(block.arg, "") if block.kind == "config" else ""
    path.write_text(base + block.text)
    try:
        load_settings(path, environ={})
    except ConfigError as exc:
        pytest.fail(f"{block.where}: the gateway refuses it:\n{exc.detail}", pytrace=False)


@pytest.mark.parametrize("block", blocks_of("json"))
def test_json_block_parses(block: Block) -> None:
    try:
        document = json.loads(block.text)
    except ValueError as exc:
        pytest.fail(f"{block.where}: not JSON ({exc}); a sample with `...` is output")
    if block.arg == "journal":
        JournalDocument.model_validate(document)
    elif block.arg:
        pytest.fail(f"{block.where}: no JSON model {block.arg!r} (known: journal)")


@pytest.mark.parametrize("block", blocks_of("output", "json"))
def test_json_output_sample_parses(block: Block) -> None:
    try:
        shown_json(block.text)
    except ValueError as exc:
        pytest.fail(f"{block.where}: not JSON, even with `...` for what is left out: {exc}")


def module_file(block: Block, suffix: str = ".py") -> str:
    """Where a block goes, assembled: a file name that is also a module name."""
    return "doc_" + re.sub(r"\W", "_", block.arg) + suffix


# --- mypy ----------------------------------------------------------------------------------------

_MYPY_LINE = re.compile(r"^(?P<file>[^:\s]+\.py):(?P<line>\d+): (?P<message>.*)$")


@pytest.mark.slow  # the first run: ~30 s; later runs: ~3 s
async def test_python_blocks_type_check(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Every Python run/typecheck block, in one mypy run. The SDKs' types take ~30 s the
    first time; the cache, kept in pytest's cache directory, makes later runs take ~3 s."""
    blocks = [
        block
        for block in BLOCKS
        if block.kind in ("run", "typecheck") and block.lang == "python" and block.arg in HARNESS
    ]
    modules = {}
    for block in blocks:
        file = module_file(block)
        (tmp_path / file).write_text(block.text)
        modules[file] = block
    cache = kept_mypy_cache(request, "docs-snippets-mypy", tmp_path)
    options = ["--strict", "--config-file=", "--python-version=3.11", "--cache-dir", str(cache)]
    finished = await run_process(
        [
            sys.executable,
            "-m",
            "mypy",
            *options,
            "--no-error-summary",
            "--show-error-codes",
            *modules,
        ],
        cwd=tmp_path,
        env=subprocess_env({}),
        seconds=300,
    )
    allowed = {(block.arg, allows) for block in blocks for allows in HARNESS[block.arg].mypy_allows}
    problems: list[str] = []
    for line in finished.output.splitlines():
        found = _MYPY_LINE.match(line)
        if found is None or found["file"] not in modules:
            problems.append(line)
            continue
        block = modules[found["file"]]
        message = found["message"]
        allowance = next(
            (a for a in allowed if a[0] == block.arg and message.startswith(f"error: {a[1]}")),
            None,
        )
        if allowance is not None:
            allowed.discard(allowance)
            continue
        where = f"{block.path.relative_to(ROOT)}:{block.line + int(found['line'])}"
        problems.append(f"{where}: {message}")
    problems += [
        f"HARNESS[{name!r}].mypy_allows: not needed any more: {a!r}" for name, a in allowed
    ]
    if finished.status not in (0, 1):
        problems.append(f"mypy exited {finished.status}: {finished.stopped}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


_TSC_LINE = re.compile(r"^(?P<file>doc_\w+\.ts)\((?P<line>\d+),(?P<column>\d+)\): (?P<message>.*)$")


async def test_typescript_blocks_type_check(tmp_path: Path) -> None:
    """The TypeScript blocks, with tsc --strict as the Node client's examples are checked
    (clients/typescript/examples/tsconfig.json), against its build and dev dependencies."""
    client = TS_README.parent
    if shutil.which("node") is None or not (client / "dist" / "index.d.ts").exists():
        pytest.skip("needs node and clients/typescript built (make ts-build; make test has it)")
    modules = tmp_path / "node_modules"
    modules.mkdir()
    for installed in (client / "node_modules").iterdir():
        (modules / installed.name).symlink_to(installed)
    (modules / "idempotency-gateway-client").symlink_to(client)
    (tmp_path / "package.json").write_text('{"type": "module"}')
    blocks = {
        module_file(block, ".ts"): block
        for block in BLOCKS
        if block.kind == "typecheck" and block.lang == "ts"
    }
    for file, block in blocks.items():
        (tmp_path / file).write_text(block.text + "export {};\n")  # every name its own
    options = {
        "target": "ES2022",
        "lib": ["ES2022"],
        "module": "NodeNext",
        "moduleResolution": "NodeNext",
        "types": ["node"],
        "strict": True,
        "exactOptionalPropertyTypes": True,
        "noEmit": True,
        "skipLibCheck": True,  # as the examples' tsconfig: framework types name DOM types
    }
    config = {"compilerOptions": options, "files": list(blocks)}
    (tmp_path / "tsconfig.json").write_text(json.dumps(config))
    tsc = modules / "typescript" / "bin" / "tsc"
    finished = await run_process(
        ["node", str(tsc), "-p", "tsconfig.json", "--pretty", "false"],
        cwd=tmp_path,
        env=subprocess_env({}),
        seconds=SECONDS,
    )
    problems = []
    for line in finished.output.splitlines():
        found = _TSC_LINE.match(line)
        if found is None or found["file"] not in blocks:
            problems.append(line)
            continue
        block = blocks[found["file"]]
        problems.append(
            f"{block.path.relative_to(ROOT)}:{block.line + int(found['line']) - 1}: "
            + found["message"]
        )
    if finished.status != 0 or problems:
        pytest.fail("\n".join(problems) or finished.output, pytrace=False)


# --- run blocks ----------------------------------------------------------------------------------


def run_groups() -> list[Any]:
    """The run blocks, each with those that run after it on its servers."""
    groups: dict[str, list[Block]] = {}
    leader: dict[str, str] = {}
    for block in BLOCKS:
        if block.kind != "run" or block.arg not in HARNESS:
            continue
        after = HARNESS[block.arg].after
        leader[block.arg] = leader.get(after, block.arg) if after else block.arg
        groups.setdefault(leader[block.arg], []).append(block)
    return [pytest.param(group, id=name) for name, group in groups.items()]


@pytest.mark.parametrize("group", run_groups())
async def test_run_block(group: list[Block], tmp_path: Path) -> None:
    needs = {need for block in group for need in HARNESS[block.arg].needs}
    lacking = sorted(n for n in needs if shutil.which(n) is None and not (ROOT / n).exists())
    if lacking:
        pytest.skip(f"needs {', '.join(lacking)}")
    serves = HARNESS[group[0].arg].serves
    config = next((b.text for b in BLOCKS if b.kind == "serve" and b.arg == serves), None)
    async with FakeModel() as model, make_run(tmp_path, config) as served:
        for block in group:
            harness = HARNESS[block.arg]
            if harness.setup is not None:
                await harness.setup(served)
            output = await run_block(block, harness, served, model)
            if harness.check is not None:
                await harness.check(Ran(served=served, model=model, output=output))


def admin_cli_env(served: MakeRun) -> dict[str, str]:
    from harness import ADMIN_TOKEN

    return {
        "IDEMPOTENCY_GATEWAY_ADMIN__TOKEN": ADMIN_TOKEN,
        "IDEMPOTENCY_GATEWAY_ADMIN__PORT": served.admin_url.rsplit(":", 1)[1],
    }


async def run_block(block: Block, harness: Harness, served: MakeRun, model: FakeModel) -> str:
    """Run the block against `served`; fail with what it printed unless it did as shown."""
    text = served.addresses.rewrite(block.text)
    env = subprocess_env(
        {
            "DOCS_GATEWAY_URL": served.gateway_url,
            "DOCS_TOOL_API_URL": served.tool_api_url,
            "DOCS_MCP_URL": served.mcp_url,
            **model.env(),
            **(admin_cli_env(served) if harness.admin_cli else {}),
        }
    )
    before = served.effects()

    def runaway() -> str:
        made = served.effects() - before
        return f"{made} tickets and emails already" if made > harness.max_effects else ""

    if block.lang == "python":
        script = served.cwd / module_file(block)
        script.write_text(text)
        finished = await run_process(
            [sys.executable, "-c", LOOPBACK_GUARD, str(script)],
            cwd=served.cwd,
            env=env,
            seconds=SECONDS,
            runaway=runaway,
        )
        if finished.status != 0:
            why = finished.stopped or f"exit status {finished.status}"
            pytest.fail(
                f"{block.where} ({block.arg}): {why} after {finished.seconds:.1f} s; "
                f"it printed:\n{finished.output[-6000:]}",
                pytrace=False,
            )
        shown = shown_output(block.text)
        problems = Transcript().mismatches(shown, finished.output.splitlines())
        if problems:
            line = block.line + 1 + len(shown.text.splitlines())
            pytest.fail(
                f"{block.path.relative_to(ROOT)}:{line}: "
                + "; ".join(problems)
                + f"; it printed:\n{finished.output[-6000:]}",
                pytrace=False,
            )
        return finished.output

    commands = [
        command
        for command in parse_shell(text)
        if not any(command.text.startswith(skipped) for skipped in harness.not_run)
    ]
    finished = await run_process(
        ["bash", "--noprofile", "--norc", "-c", shell_script(commands)],
        cwd=served.cwd,
        env=env,
        seconds=SECONDS,
        runaway=runaway,
    )
    problems = [f"{block.where}: stopped: {finished.stopped}"] if finished.stopped else []
    transcript = Transcript()
    for command, (printed, status) in zip(
        commands, split_transcript(finished.output, len(commands)), strict=True
    ):
        problems += [
            f"{where(block, command)}: {problem}; it printed:\n" + "\n".join(printed)
            for problem in shell_problems(command, printed, status, transcript)
        ]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    return finished.output


def shell_problems(
    command: Command, printed: list[str], status: int | None, transcript: Transcript
) -> list[str]:
    if status != command.status:
        return [f"exit status {status}, the docs say {command.status}"]
    return transcript.mismatches(command, printed)


def where(block: Block, command: Command) -> str:
    first = command.text.splitlines()[0]
    return f"{block.path.relative_to(ROOT)}:{block.line + 1 + command.line} ({first[:60]!r})"


# --- The checks themselves -----------------------------------------------------------------------


def test_markers_are_read_and_misplaced_ones_reported(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- snippet: run a-name -->\n```sh\necho\n```\n\n"
        "<!-- snippet: skip -->\n```sh\necho\n```\n\n"
        "<!-- snippet: output -->\n\n```\nx\n```\n"
    )
    run, skip, unmarked = read_blocks(doc)
    assert (run.kind, run.arg, run.line, run.text) == ("run", "a-name", 2, "echo\n")
    assert (skip.kind, unmarked.kind, unmarked.marker_problem) == (None, None, "")
    assert "needs a reason" in skip.marker_problem
    assert stray_markers(doc) == [11]


def test_a_python_block_is_a_whole_program_and_shows_what_it_prints() -> None:
    program = "import asyncio\n\nasync def main() -> None:\n    print(1)\n\nasyncio.run(main())\n"
    assert runs_itself(program)
    guarded = 'if __name__ == "__main__":\n    asyncio.run'
    assert runs_itself(program.replace("asyncio.run", guarded))
    assert not runs_itself("await main()\n")
    assert not runs_itself("async with client:\n    await client.call()\n")  # SyntaxError
    assert not runs_itself("async def main() -> None:\n    asyncio.run(other())\n")
    shown = shown_output(program + "# 1\n#   and more\n")
    assert (shown.text, shown.expected) == (program.rstrip("\n"), ["1", "  and more"])
    assert shown_output(program).expected == []
    assert shown_output(program + "\n# prose after a blank line\n").expected == []


def test_run_ids_of_a_block(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- snippet: run a -->\n```python\n"
        'RUN_ID = "run-a"\nconfig = {"configurable": {"thread_id": "run-b"}}\n'
        'Run(journal, run_id="run-c")\nkey = derive_key("run-d", 0, "c1")\n'
        'meta = {"idempotencyKey": "run-e:3:call_x"}\nturn = items[1:2:3]\n```\n\n'
        "<!-- snippet: run b -->\n```sh\n"
        "curl -s localhost:8080/operations/run-f:0:c1   # also /operations/run-g%3A0%3Ac1\n"
        "curl -s http://127.0.0.1:8080/v1/issues\n# demo-b4f1c8:0:c1\n```\n"
    )
    python, shell = read_blocks(doc)
    assert run_ids(python) == {"run-a", "run-b", "run-c", "run-d", "run-e"}
    assert run_ids(shell) == {"run-f", "run-g"}  # not a URL's host:port, nor a random id


def test_shown_output_must_be_printed_in_order() -> None:
    [crash, resume] = parse_shell(
        "X=1 run  # trailing words\n# run demo-b4f1c8: new\n# ...\n"
        "# Killed   (exit status 137)\n\n# prose\nrun \\\n  --again\n"
        '# run demo-b4f1c8: resumed\n# {"id": "op_01...", "n": 1, ...}\n'
    )
    assert (crash.status, crash.expected) == (137, ["run demo-b4f1c8: new", "..."])
    assert (resume.text, resume.status) == ("run \\\n  --again", 0)
    transcript = Transcript()
    assert transcript.mismatches(crash, ["run demo-0a1b2c: new", "more"]) == []
    printed = ["run demo-0a1b2c: resumed", '{"id": "op_01X", "n": 1, "at": 2}']
    assert transcript.mismatches(resume, printed) == []
    assert transcript.mismatches(resume, ["run demo-999999: resumed", printed[1]]) != []
    assert transcript.mismatches(resume, [printed[1], printed[0]]) != []  # out of order
    assert transcript.mismatches(resume, [printed[0], '{"id": "op_01X", "n": 2}']) != []


@pytest.mark.parametrize(
    ("shown", "actual", "matches"),
    [
        ('{"a": 1, ...}', {"a": 1, "b": 2}, True),
        ('{"a": 1}', {"a": 1, "b": 2}, False),
        ('{"a": ..., "r": {...}}', {"a": [1], "r": {"q": 1}}, True),
        ("[1, ...]", [0, 1, 2], True),
        ("[1, 3]", [1, 2, 3], False),
        ('{"type": ".../key-mismatch"}', {"type": "https://x/problems/key-mismatch"}, True),
        ('{"id": "op_01..."}', {"id": "op_02M8"}, False),
        ('{"replayed": 1}', {"replayed": True}, False),
    ],
)
def test_shown_json(shown: str, actual: Any, matches: bool) -> None:
    assert json_matches(shown_json(shown), actual) is matches
