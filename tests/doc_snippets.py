"""The docs' code blocks, and what `tests/test_docs_snippets.py` does with them.

Every fenced code block in the docs is classified by an HTML comment on the
line right before its fence (invisible on GitHub):

    <!-- snippet: run NAME -->        executed against real servers; NAME is its entry
                                      in test_docs_snippets.HARNESS (setup, checks)
    <!-- snippet: typecheck NAME -->  Python, type-checked only (mypy --strict)
    <!-- snippet: config [BASE] -->   TOML, loaded by the gateway's own loader
                                      (BASE: a fragment, placed into a minimal config)
    <!-- snippet: serve NAME -->      TOML, a whole config: loaded like `config`, and the
                                      gateway that run blocks with Harness(serves=NAME)
                                      talk to (its :9000 and :9100 upstreams rewritten)
    <!-- snippet: json [MODEL] -->    valid JSON (MODEL: a model it must validate against)
    <!-- snippet: output -->          sample output with placeholders (`...`): not run;
                                      a ```json one must parse, `...` for what is left out
    <!-- snippet: text -->            not code: a diagram, a directory tree
    <!-- snippet: skip: REASON -->    code not run here, and why

A marker separated from its fence (a blank line between) classifies nothing
and is reported, as is every block without one.

A Python `run` or `typecheck` block is a whole program, as a reader copies it
into a file: its imports, the names it uses, an `async def main()` and a
top-level `asyncio.run(main())`. It runs (and mypy checks it) as written,
nothing put before or after it. The comment lines right under its last line
of code are what it prints, matched as a shell command's shown output is.

This module parses the markdown, the shell transcripts and the run ids in
it, serves the servers `make run` serves (on free ports), a loopback fake
model API, and runs the blocks in subprocesses with a time limit.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent

KINDS = ("run", "typecheck", "config", "serve", "json", "output", "text", "skip")

_MARKER = re.compile(r"^\s{0,3}<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s{0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


# --- The markdown -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One fenced code block and its classification."""

    path: Path
    line: int
    """The 1-based line of the opening fence."""
    lang: str
    text: str
    kind: str | None = None
    """One of KINDS, or None when the block is unclassified."""
    arg: str = ""
    """The NAME, BASE or MODEL after the kind, or a skip's reason."""
    marker_problem: str = ""
    """Why the marker before the block is not understood (empty when it is)."""

    @property
    def where(self) -> str:
        return f"{_relative(self.path)}:{self.line}"

    @property
    def first_line(self) -> str:
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def read_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a markdown file, with the marker on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening["fence"]
        indent = len(opening["indent"])
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"]
            ):
                break
            body.append(_dedent_line(lines[end], indent))
            end += 1
        text = "\n".join(body) + ("\n" if body else "")
        lang = opening["info"].split()[0] if opening["info"] else ""
        marker = _MARKER.match(lines[index - 1]) if index > 0 else None
        kind, arg, problem = _parse_marker(marker["body"]) if marker else (None, "", "")
        blocks.append(
            Block(path, index + 1, lang, text, kind=kind, arg=arg, marker_problem=problem)
        )
        index = end + 1
    return blocks


def stray_markers(path: Path) -> list[int]:
    """The lines of markers that are not right before a fence (so classify nothing)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [
        number
        for number, line in enumerate(lines, start=1)
        if _MARKER.match(line) and (number == len(lines) or not _FENCE.match(lines[number]))
    ]


def _dedent_line(line: str, indent: int) -> str:
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(indent, stripped) :]


def _parse_marker(body: str) -> tuple[str | None, str, str]:
    """(kind, arg, problem) of a marker's body: `run NAME`, `config`, `skip: reason`..."""
    if body.startswith("skip"):
        reason = body.removeprefix("skip").lstrip()
        if not reason.startswith(":") or not reason[1:].strip():
            return None, "", "a skip needs a reason: <!-- snippet: skip: REASON -->"
        return "skip", reason[1:].strip(), ""
    kind, _, arg = body.partition(" ")
    arg = arg.strip()
    if kind not in KINDS:
        return None, "", f"unknown kind {kind!r} (one of {', '.join(KINDS)})"
    if kind in ("run", "typecheck", "serve") and not arg:
        return None, "", f"<!-- snippet: {kind} NAME -->: a {kind} block needs a name"
    if kind in ("output", "text") and arg:
        return None, "", f"<!-- snippet: {kind} --> takes nothing after the kind"
    if arg and not _NAME.match(arg):
        return None, "", f"{arg!r} is not a name (lower case, digits, '-', '.')"
    return kind, arg, ""


# --- Rewriting what `make run` serves to what the test serves -----------------------------------

MAKE_RUN_PORTS = {"8080": "gateway", "8081": "admin", "9000": "tool_api", "9100": "mcp"}
_LOCAL_URL = re.compile(r"\b(?:localhost|127\.0\.0\.1):(8080|8081|9000|9100)\b")
_AGENT_EXAMPLE = re.compile(r"(-m examples\.agent_recovery|examples/agent_recovery\.mjs)\b")


@dataclass(frozen=True)
class Addresses:
    """host:port of the test's gateway, its admin listener, the tool API, the MCP server."""

    gateway: str
    admin: str
    tool_api: str
    mcp: str

    def rewrite(self, text: str) -> str:
        """`make run`'s addresses in `text` replaced by the test servers'; the example
        agents (which take --gateway and --tool-api) pointed at them."""
        text = _LOCAL_URL.sub(lambda m: getattr(self, MAKE_RUN_PORTS[m[1]]), text)
        flags = f" --gateway http://{self.gateway} --tool-api http://{self.tool_api}"
        return _AGENT_EXAMPLE.sub(lambda m: m[1] + flags, text)


# --- Shell transcripts: commands and the output the docs show for them ---------------------------


@dataclass
class Command:
    """A command of a shell block and the output shown for it (comment lines under it)."""

    line: int
    """The 0-based line in the block where it starts."""
    text: str
    expected: list[str] = field(default_factory=list)
    status: int = 0
    """The exit status the docs expect: 0 unless a shown line ends `(exit status N)`."""


_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)\1")
_EXIT_STATUS = re.compile(r"\(exit status (\d+)\)\s*$")


def parse_shell(text: str) -> list[Command]:
    """The commands of a shell block, each with the output shown under it.

    Comment lines directly under a command (no blank line between) are its
    output as the docs show it; comments after a blank line, or at the top, are
    prose. A shown line ending `(exit status N)` says the command exits N (the
    line is what an interactive shell prints, e.g. `Killed`).
    """
    lines = text.splitlines()
    commands: list[Command] = []
    index = 0
    current: Command | None = None
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if not stripped:
            current = None
            index += 1
            continue
        if stripped.startswith("#"):
            if current is not None:
                shown = stripped[1:]
                shown = shown[1:] if shown.startswith(" ") else shown
                status = _EXIT_STATUS.search(shown)
                if status:
                    current.status = int(status[1])
                else:
                    current.expected.append(shown)
            index += 1
            continue
        start = index
        taken = [line]
        heredoc = _HEREDOC.search(line)
        while taken[-1].endswith("\\") and index + 1 < len(lines):
            index += 1
            taken.append(lines[index])
            heredoc = heredoc or _HEREDOC.search(lines[index])
        if heredoc:
            while index + 1 < len(lines):
                index += 1
                taken.append(lines[index])
                if lines[index].strip() == heredoc["word"]:
                    break
        current = Command(line=start, text="\n".join(taken))
        commands.append(current)
        index += 1
    return commands


def shell_script(commands: list[Command]) -> str:
    """One bash script running the commands in order, each between markers that
    `split_transcript` finds: one shell, so variables and the directory carry over."""
    parts = ["set -o pipefail"]
    for number, command in enumerate(commands):
        parts.append(f"echo '@@command {number}@@'")
        parts.append(command.text)
        # A newline first: the output may not end with one (curl -s of a JSON body).
        parts.append(f"printf '\\n@@status {number} %d@@\\n' $?")
    return "\n".join(parts) + "\n"


_STATUS_LINE = re.compile(r"^@@status (\d+) (\d+)@@$")


def split_transcript(output: str, count: int) -> list[tuple[list[str], int | None]]:
    """Each command's output lines (CR stripped) and exit status, from `shell_script`'s output."""
    results: list[tuple[list[str], int | None]] = [([], None) for _ in range(count)]
    current: int | None = None
    for raw in output.splitlines():
        line = raw.rstrip("\r")
        if line.startswith("@@command ") and line.endswith("@@"):
            current = int(line[len("@@command ") : -2])
            continue
        status = _STATUS_LINE.match(line)
        if status:
            results[int(status[1])] = (results[int(status[1])][0], int(status[2]))
            current = None
            continue
        if current is not None:
            results[current][0].append(line)
    return results


VOLATILE = (re.compile(r"demo-[0-9a-f]{6}"),)
"""Tokens that differ on every run (the example agent's run ids): the docs' value
matches any value of the same form, the same one wherever the docs repeat it."""


class _Ellipsis:
    """`...` standing for a JSON value."""

    def __repr__(self) -> str:
        return "..."


ANY = _Ellipsis()
_ANY_TOKEN = "\x00any"
_MORE = "\x00more"
"""An object member or array item `...`: more members or items may be there."""


def shown_json(text: str) -> Any:
    """Parse the JSON the docs show, where `...` may stand for members (`{"a": 1, ...}`),
    items (`[1, ...]`) or a value (`{"a": ...}`); in a string, for any characters.
    ValueError when it is not JSON even so."""
    out: list[str] = []
    open_brackets: list[str] = []
    index = 0
    in_string = False
    last = ""
    while index < len(text):
        char = text[index]
        if in_string:
            out.append(char)
            if char == "\\" and index + 1 < len(text):
                out.append(text[index + 1])
                index += 1
            elif char == '"':
                in_string = False
            index += 1
            continue
        if text.startswith("...", index):
            container = open_brackets[-1] if open_brackets else ""
            if container == "{" and last in ("{", ","):
                out.append(json.dumps(_MORE) + ": null")
            elif container == "[" and last in ("[", ","):
                out.append(json.dumps(_MORE))
            else:
                out.append(json.dumps(_ANY_TOKEN))
            index += 3
            last = "."
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            open_brackets.append(char)
        elif char in "}]" and open_brackets:
            open_brackets.pop()
        if not char.isspace():
            last = char
        out.append(char)
        index += 1
    return _with_ellipses(json.loads("".join(out)))


def _with_ellipses(value: Any) -> Any:
    if value == _ANY_TOKEN:
        return ANY
    if isinstance(value, dict):
        return {key: _with_ellipses(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_with_ellipses(item) for item in value]
    return value


def json_matches(shown: Any, actual: Any) -> bool:
    """Whether `actual` is what the docs show: equal, but for the `...`s."""
    if shown is ANY:
        return True
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return False
        keys = set(shown) - {_MORE}
        if not keys <= set(actual) or (_MORE not in shown and keys != set(actual)):
            return False
        return all(json_matches(shown[key], actual[key]) for key in keys)
    if isinstance(shown, list):
        if not isinstance(actual, list):
            return False
        items = [item for item in shown if item != _MORE]
        if len(items) == len(shown):
            return len(actual) == len(items) and all(map(json_matches, items, actual))
        rest = iter(actual)  # with `...`: the items shown, in order, among others
        return all(any(json_matches(item, other) for other in rest) for item in items)
    if isinstance(shown, str) and "..." in shown:
        return isinstance(actual, str) and re.fullmatch(_glob(shown), actual) is not None
    return type(shown) is type(actual) and shown == actual


def _glob(text: str) -> str:
    return ".*?".join(re.escape(part) for part in text.split("..."))


def _shown_units(expected: list[str]) -> Iterator[str]:
    """The shown lines, a JSON value spanning lines joined into one unit; `...` lines dropped."""
    index = 0
    while index < len(expected):
        line = expected[index]
        if line.strip() == "...":
            index += 1
            continue
        if line.lstrip().startswith(("{", "[")):
            joined = line
            while _depth(joined) > 0 and index + 1 < len(expected):
                index += 1
                joined += "\n" + expected[index]
            yield joined
        else:
            yield line
        index += 1


def _depth(text: str) -> int:
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return depth


@dataclass
class Transcript:
    """Matches what the docs show against what ran, binding VOLATILE tokens as it goes."""

    bound: dict[str, str] = field(default_factory=dict)

    def mismatches(self, command: Command, actual: list[str]) -> list[str]:
        """Each shown unit must match an actual line (or JSON value), in order; other
        lines may come between (a response's other headers, `...`)."""
        problems: list[str] = []
        position = 0
        for unit in _shown_units(command.expected):
            found = self._find(unit, actual, position)
            if found is None:
                problems.append(f"shown but not printed: {unit!r}")
            else:
                position = found + 1
        return problems

    def _find(self, unit: str, actual: list[str], start: int) -> int | None:
        try:
            shown = shown_json(unit) if unit.lstrip().startswith(("{", "[")) else None
        except ValueError:
            shown = None  # not JSON: a line like any other
        if shown is not None:
            for index in range(start, len(actual)):
                try:
                    value = json.loads(actual[index])
                except ValueError:
                    continue
                if json_matches(shown, value):
                    return index
            return None
        for index in range(start, len(actual)):
            binding = self._match_line(unit, actual[index])
            if binding is not None:
                self.bound.update(binding)
                return index
        return None

    def _match_line(self, shown: str, actual: str) -> dict[str, str] | None:
        pattern = ""
        groups: dict[str, str] = {}
        position = 0
        tokens = sorted(
            (m for volatile in VOLATILE for m in volatile.finditer(shown)), key=lambda m: m.start()
        )
        for token in tokens:
            pattern += _glob(shown[position : token.start()])
            value = token[0]
            if value in self.bound:
                pattern += re.escape(self.bound[value])
            elif value in groups:
                pattern += f"(?P={groups[value]})"
            else:
                groups[value] = f"v{len(groups)}"
                volatile = next(v for v in VOLATILE if v.fullmatch(value))
                pattern += f"(?P<{groups[value]}>{volatile.pattern})"
            position = token.end()
        pattern += _glob(shown[position:])
        found = re.fullmatch(pattern, actual.rstrip())
        if found is None:
            return None
        return {value: found[name] for value, name in groups.items()}


# --- Python blocks: whole programs --------------------------------------------------------------


def runs_itself(block_text: str) -> bool:
    """Whether a Python block is a whole program: a top-level `asyncio.run(...)` (or one
    under `if __name__ == "__main__":`) runs it."""
    try:
        tree = ast.parse(block_text)
    except SyntaxError:
        return False
    statements = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "__name__ == '__main__'",
            "'__main__' == __name__",
        ):
            statements += node.body
    return any(
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "asyncio.run"
        for node in statements
    )


def shown_output(block_text: str) -> Command:
    """What a Python block shows it prints: the comment lines right under its last line of
    code (no blank line between, as under a shell command), as the shown output of one
    command (matched by `Transcript`)."""
    lines = block_text.rstrip().splitlines()
    end = len(lines)
    while end > 0 and lines[end - 1].lstrip().startswith("#"):
        end -= 1
    if end == 0 or not lines[end - 1].strip():
        end = len(lines)  # comments after a blank line, or only comments: prose
    command = Command(line=0, text="\n".join(lines[:end]))
    for line in lines[end:]:
        shown = line.strip()[1:]
        command.expected.append(shown[1:] if shown.startswith(" ") else shown)
    return command


# --- Run ids: each document its own -------------------------------------------------------------

_KEY = re.compile(r"(?<![\w.%-])([A-Za-z0-9][\w.-]*)(?::|%3A)\d+(?::|%3A)[\w.-]+", re.IGNORECASE)
"""A key `run_id:turn:call_id` (also percent-encoded, in a lookup URL): its run id."""
_RUN_ID_NAMES = ("run_id", "thread_id")
"""Python names, keywords and dict keys whose string value is a run id (LangGraph's
thread id is the run id of its keys)."""


def run_ids(block: Block) -> set[str]:
    """The run ids a block a reader runs uses: those of the keys it shows (`run-77:0:c1`,
    `run-77%3A0%3Ac1`) and, in Python, the strings given as a run id (`RUN_ID = ...`,
    `run_id=...`, `{"thread_id": ...}`, `derive_key("...", ...)`). Random ones minted per run
    (VOLATILE: the example agent's) are left out."""
    texts = [block.text]
    found: set[str] = set()
    if block.lang == "python":
        with contextlib.suppress(SyntaxError):
            tree = ast.parse(block.text)
            found = _python_run_ids(tree)
            texts = [  # the keys in its strings and comments, not a slice `[1:2:3]`
                *(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)),
                *(line.partition("#")[2] for line in block.text.splitlines()),
            ]
    found |= {match[1] for text in texts if isinstance(text, str) for match in _KEY.finditer(text)}
    return {run_id for run_id in found if not any(v.fullmatch(run_id) for v in VOLATILE)}


def _python_run_ids(tree: ast.AST) -> set[str]:
    def named(name: object) -> bool:
        return isinstance(name, str) and name.lower() in _RUN_ID_NAMES

    values: list[ast.expr | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and named(t.id) for t in targets):
                values.append(node.value)
        elif isinstance(node, ast.keyword) and named(node.arg):
            values.append(node.value)
        elif isinstance(node, ast.Dict):
            pairs = zip(node.keys, node.values, strict=True)
            values += [value for key, value in pairs if named(getattr(key, "value", None))]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("derive_key"):
            values += node.args[:1]
    return {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}


LOOPBACK_GUARD = """
import runpy, sys

def _loopback(host):
    host = host.decode() if isinstance(host, bytes) else host
    return host is None or host in ("localhost", "::1") or str(host).startswith("127.")

def _guard(event, args):
    if event == "socket.getaddrinfo" and not _loopback(args[0]):
        raise RuntimeError(f"a docs snippet tried to resolve {args[0]!r}: loopback only")
    if event == "socket.connect" and isinstance(args[1], tuple) and not _loopback(args[1][0]):
        raise RuntimeError(f"a docs snippet tried to connect to {args[1]!r}: loopback only")

sys.addaudithook(_guard)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""`python -c LOOPBACK_GUARD FILE` runs FILE with every name lookup and connection outside
loopback refused: a snippet whose SDK client ignored the fake model's URL fails, it does
not reach the internet."""


# --- Running things ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    status: int | None
    """The exit status; None when it was killed for taking too long or running away."""
    output: str
    seconds: float
    stopped: str = ""
    """Why it was killed ("" when it exited by itself)."""


def subprocess_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The test's environment for a snippet: no proxies, no gateway settings, no bytecode
    written into the repository, plus `extra`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if "proxy" not in name.lower() and not name.startswith("IDEMPOTENCY_GATEWAY_")
    }
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "NO_PROXY": "*", "no_proxy": "*"})
    env.update(extra)
    return env


async def run_process(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    seconds: float,
    runaway: Callable[[], str] | None = None,
) -> Finished:
    """Run `argv` (its own process group) to its end, stdout and stderr together; kill its
    group after `seconds`, or as soon as `runaway()` says why it must stop."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    communicating = asyncio.ensure_future(process.communicate())
    stopped = ""
    try:
        while not communicating.done():
            await asyncio.wait({communicating}, timeout=0.05)
            if not communicating.done():
                why = runaway() if runaway is not None else ""
                if why or time.monotonic() - started > seconds:
                    stopped = why or f"still running after {seconds:.0f} s"
                    break
    finally:
        if not communicating.done():  # stopped, or the test was interrupted
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    output, _ = await communicating
    return Finished(
        status=None if stopped else process.returncode,
        output=output.decode("utf-8", "replace"),
        seconds=time.monotonic() - started,
        stopped=stopped,
    )


# --- The servers `make run` serves ---------------------------------------------------------------


@dataclass
class MakeRun:
    """What `make run` serves (config/gateway.toml's gateway, the ticket API, the MCP
    server), in this process, on free loopback ports; `cwd` is where snippets run."""

    cwd: Path
    gateway_url: str
    admin_url: str
    """The admin listener: `make run` makes an admin token per run; this one has ADMIN_TOKEN."""
    admin_token: str
    tool_api_url: str
    mcp_url: str
    tool_state: Any
    """examples.tool_api.ToolState: the tickets and emails of the ticket API."""
    mcp_state: Any
    """examples.mcp_server.ServerState: the tickets and emails of the MCP server."""

    @property
    def addresses(self) -> Addresses:
        def host_port(url: str) -> str:
            return url.split("://", 1)[1].split("/", 1)[0]

        return Addresses(
            gateway=host_port(self.gateway_url),
            admin=host_port(self.admin_url),
            tool_api=host_port(self.tool_api_url),
            mcp=host_port(self.mcp_url),
        )

    def effects(self) -> int:
        state, mcp = self.tool_state, self.mcp_state
        return len(state.issues) + len(state.emails) + len(mcp.tickets) + len(mcp.emails)


@contextlib.asynccontextmanager
async def make_run(cwd: Path, config: str | None = None) -> AsyncIterator[MakeRun]:
    """Serve config/gateway.toml as `make run` does, on free ports, its store in `cwd`/data.

    `cwd` gets `.venv`, `examples` and `config` links, so the docs' `.venv/bin/python -m
    examples...`, `node examples/...` and the CLI run there as in a checkout, writing
    `data/...` into `cwd`.

    `config` (a docs' `serve` block) is served instead of config/gateway.toml, as
    written but for its upstreams (the docs' :9000 and :9100 are the servers here) and
    what every served gateway gets: free ports, the store in `cwd`, the admin token.
    """
    from harness import ADMIN_TOKEN, start_gateway, stop_gateway
    from mcp_upstream import _Serving

    from examples.mcp_server import MCP_PATH, ServerState, create_server
    from examples.tool_api import STATE, create_app
    from gateway.config import load_settings

    for name, target in (
        (".venv", Path(sys.prefix)),
        ("examples", ROOT / "examples"),
        ("config", ROOT / "config"),
    ):
        link = cwd / name
        if not link.exists():
            link.symlink_to(target, target_is_directory=True)
    (cwd / "data").mkdir(exist_ok=True)

    tool_app = create_app()
    tool_runner = web.AppRunner(tool_app, access_log=None)
    await tool_runner.setup()
    await web.TCPSite(tool_runner, "127.0.0.1", 0).start()
    tool_api_url = "http://{}:{}".format(*tool_runner.addresses[0][:2])

    mcp_state = ServerState()
    server = create_server(mcp_state)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    mcp_url = f"http://127.0.0.1:{sock.getsockname()[1]}{MCP_PATH}"
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host="127.0.0.1")
    serving = _Serving(app, server.session_manager, 1)
    try:
        await serving.start(sock)
    except BaseException:
        sock.close()
        await tool_runner.cleanup()
        raise
    try:
        overrides: dict[str, object] = {
            "server.port": 0,
            "admin.port": 0,
            "admin.token": ADMIN_TOKEN,
            "store.url": f"sqlite:///{cwd / 'data' / 'gateway.db'}",
            "logging.level": "warning",
            # The README's slow walk-through probes a late ticket by hand (step 6), and the
            # sweep probes unknown operations too, every `sweep_interval` (60 s): the blocks'
            # fixed offsets put a sweep seconds after the ticket exists, and on a loaded
            # machine it probed first (the hand's probe then answers 409, the operation being
            # completed, as README.md says can happen). Here the sweep waits an hour.
            "idempotency.sweep_interval": "1h",
        }
        if config is None:
            config_path = ROOT / "config" / "gateway.toml"
            overrides.update(
                {
                    "routes[0].upstream": tool_api_url,
                    "routes[1].upstream": mcp_url,
                    # `make run` puts its venv's python3 first on PATH; here it is this one.
                    "routes[2].command": [sys.executable, "-m", "examples.mcp_server", "--stdio"],
                }
            )
        else:
            config_path = cwd / "served.toml"
            config_path.write_text(_served_upstreams(config, tool_api_url, mcp_url))
        settings = load_settings(config_path, environ={}, overrides=overrides)
        gateway = await start_gateway(settings)
        assert gateway.admin_url is not None
        try:
            yield MakeRun(
                cwd=cwd,
                gateway_url=gateway.url,
                admin_url=gateway.admin_url,
                admin_token=ADMIN_TOKEN,
                tool_api_url=tool_api_url,
                mcp_url=mcp_url,
                tool_state=tool_app[STATE],
                mcp_state=mcp_state,
            )
        finally:
            await stop_gateway(gateway)
    finally:
        await serving.stop()
        await tool_runner.cleanup()


def _served_upstreams(config: str, tool_api_url: str, mcp_url: str) -> str:
    """A served config's upstreams (`127.0.0.1:9000`, `:9100`) made the test servers'."""
    host_port = {
        port: url.split("://", 1)[1].split("/", 1)[0]
        for port, url in (("9000", tool_api_url), ("9100", mcp_url))
    }
    return _LOCAL_URL.sub(lambda m: host_port.get(m[1], m[0]), config)


# --- A model API on loopback ----------------------------------------------------------------------


class FakeModel:
    """Enough of OpenAI's chat completions and Anthropic's messages API for a tool-use loop:
    the first request gets one `create_ticket` call, a request carrying its result gets a
    final text answer. Requests are checked the way the real APIs check them (tool
    schemas are JSON Schema objects, every tool call is answered); a bad one is a 400."""

    TITLE = "Printer on fire"
    OPENAI_CALL_ID = "call_docs_1"
    ANTHROPIC_CALL_ID = "toolu_docs_1"

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> FakeModel:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = "http://{}:{}".format(*self._runner.addresses[0][:2])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def env(self) -> dict[str, str]:
        """What points the SDKs' default clients at this server."""
        return {
            "OPENAI_BASE_URL": f"{self.url}/v1",
            "OPENAI_API_KEY": "sk-docs-test",
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": "sk-ant-docs-test",
        }

    async def _openai(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("openai", body))
        problem = _openai_problem(body)
        if problem:
            error = {"message": problem, "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=400)
        answered = any(message.get("role") == "tool" for message in body["messages"])
        if answered:
            message: dict[str, Any] = {"role": "assistant", "content": "The ticket is open."}
        else:
            arguments = json.dumps({"title": self.TITLE})
            call = {"name": "create_ticket", "arguments": arguments}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": self.OPENAI_CALL_ID, "type": "function", "function": call}],
            }
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": "stop" if answered else "tool_calls",
        }
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [choice],
            }
        )

    async def _anthropic(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("anthropic", body))
        problem = _anthropic_problem(body)
        if problem:
            error = {"type": "invalid_request_error", "message": problem}
            return web.json_response({"type": "error", "error": error}, status=400)
        last = body["messages"][-1]
        answered = isinstance(last["content"], list) and any(
            block.get("type") == "tool_result" for block in last["content"]
        )
        if answered:
            content: list[dict[str, Any]] = [{"type": "text", "text": "The ticket is open."}]
        else:
            content = [
                {
                    "type": "tool_use",
                    "id": self.ANTHROPIC_CALL_ID,
                    "name": "create_ticket",
                    "input": {"title": self.TITLE},
                }
            ]
        return web.json_response(
            {
                "id": f"msg_{len(self.requests)}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", ""),
                "content": content,
                "stop_reason": "end_turn" if answered else "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        )


def _schema_problem(schema: Any, where: str) -> str:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return f"{where}: a JSON Schema object (type: object) is required, got {schema!r}"
    return ""


def _openai_problem(body: dict[str, Any]) -> str:
    for tool in body.get("tools", []):
        if tool.get("type") != "function" or "name" not in tool.get("function", {}):
            return f"tools: not a function tool: {tool!r}"
        problem = _schema_problem(tool["function"].get("parameters"), "tools[].function.parameters")
        if problem:
            return problem
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: a non-empty list is required"
    waiting: list[str] = []
    for message in messages:
        role = message.get("role")
        if waiting and role != "tool":
            return f"tool calls {waiting} are not followed by their tool messages"
        if role == "tool":
            if message.get("tool_call_id") not in waiting:
                return f"a tool message answers no pending call: {message!r}"
            if not isinstance(message.get("content"), str):
                return "tool message content: a string is required"
            waiting.remove(message["tool_call_id"])
        elif role == "assistant":
            waiting = [call["id"] for call in message.get("tool_calls") or []]
    return f"tool calls {waiting} are not answered" if waiting else ""


def _anthropic_problem(body: dict[str, Any]) -> str:
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: required"
    for tool in body.get("tools", []):
        if "name" not in tool:
            return f"tools: a tool needs a name: {tool!r}"
        problem = _schema_problem(tool.get("input_schema"), "tools[].input_schema")
        if problem:
            return problem
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or messages[0].get("role") != "user":
        return "messages: must start with a user message"
    waiting: set[str] = set()
    for message in messages:
        blocks = message["content"] if isinstance(message["content"], list) else []
        if message.get("role") == "user":
            answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
            if answered != waiting:
                return f"tool_use ids {sorted(waiting)} must be answered by the next user message"
            waiting = set()
        else:
            waiting = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    return f"tool_use ids {sorted(waiting)} are not answered" if waiting else ""
