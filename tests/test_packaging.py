"""What a user's tools see of the installed packages.

From the first-hour report: after `pip install -e clients/python`, a user's
`mypy --strict` failed on `import idempotency_gateway_client`, because
setuptools' editable finder is an import hook that type checkers cannot follow.
Both projects now install editable as a plain path entry.

And from the second: the packages a release ships (`python -m build`: an sdist,
then the wheel built from it) install into a fresh venv, with nothing of this
checkout on the path, and run: the gateway serves and replays, the console's
files come from the package, the client's types reach a user's mypy.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import aiohttp
import idempotency_gateway_client
import pytest
from harness import ADMIN_TOKEN, ROOT, GatewayProcess, settings_for, write_config
from mypy_cache import kept_mypy_cache
from upstream import CountingUpstream

import gateway


def site_packages() -> Path:
    return Path(next(p for p in sys.path if p.endswith("site-packages")))


def test_editable_installs_are_plain_path_entries() -> None:
    """The `.pth` files name directories, not an import-hook module mypy cannot read."""
    entries = {
        pth.name: pth.read_text().strip()
        for pth in site_packages().glob("__editable__*idempotency_gateway*.pth")
    }
    assert len(entries) == 2, entries
    for name, text in entries.items():
        assert not text.startswith("import "), (name, text)
        assert Path(text).is_dir(), (name, text)


def test_a_users_mypy_strict_sees_the_clients_types(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Outside the repository (so only the installed packages are found), strict mypy passes
    and sees real types, not `Any`."""
    user = tmp_path / "agent.py"
    user.write_text(
        "from idempotency_gateway_client import GatewayClient, derive_key\n"
        "\n"
        "key: str = derive_key('run-1', 0, 'c1')\n"
        "reveal_type(GatewayClient.lookup)\n"
    )
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(kept_mypy_cache(request, "packaging-mypy-checkout", tmp_path)),
            "agent.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "import-not-found" not in finished.stdout
    # Followed into the package: the method's real signature, not `Any`.
    assert "idempotency_gateway_client._models.Operation | None" in finished.stdout
    assert str(ROOT) not in str(tmp_path)


def run(command: list[str | Path], cwd: Path, seconds: float = 300) -> str:
    finished = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=seconds,
    )
    assert finished.returncode == 0, f"{command}:\n{finished.stdout}\n{finished.stderr}"
    return finished.stdout


def test_each_version_is_stated_once() -> None:
    """The packages read their version from the module that holds it; nothing repeats it."""
    for project in (ROOT / "pyproject.toml", ROOT / "clients" / "python" / "pyproject.toml"):
        metadata = tomllib.loads(project.read_text())
        assert "version" not in metadata["project"], project
        assert metadata["project"]["dynamic"] == ["version"], project
        assert metadata["tool"]["setuptools"]["dynamic"]["version"]["attr"].endswith(".__version__")
    assert re.fullmatch(r"\d+\.\d+\.\d+", gateway.__version__)
    assert re.fullmatch(r"\d+\.\d+\.\d+", idempotency_gateway_client.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {gateway.__version__}" in changelog


def build_and_install(tmp_path: Path) -> Path:
    """Build both projects as a release would and install their wheels into a fresh venv;
    its path. Checks what the archives carry on the way."""
    dist = tmp_path / "dist"
    for project in (ROOT, ROOT / "clients" / "python"):
        run([sys.executable, "-m", "build", "--outdir", dist, project], cwd=tmp_path)
    server = f"idempotency_gateway-{gateway.__version__}"
    client = f"idempotency_gateway_client-{idempotency_gateway_client.__version__}"
    assert sorted(path.name for path in dist.iterdir()) == [
        f"{server}-py3-none-any.whl",
        f"{server}.tar.gz",
        f"{client}-py3-none-any.whl",
        f"{client}.tar.gz",
    ]
    # The sdist (the wheel was built from it) carries the license, the readme, the
    # type marker and, for the gateway, the console's files.
    for sdist, members in (
        (
            server,
            [
                "LICENSE",
                "README.md",
                "CHANGELOG.md",
                "gateway/py.typed",
                "gateway/web/console/index.html",
            ],
        ),
        (client, ["LICENSE", "README.md", "idempotency_gateway_client/py.typed"]),
    ):
        with tarfile.open(dist / f"{sdist}.tar.gz") as archive:
            names = set(archive.getnames())
        assert {f"{sdist}/{member}" for member in members} <= names, sorted(names)
        assert not any("/tests/" in name for name in names), "the suite needs the checkout"
    with zipfile.ZipFile(dist / f"{client}-py3-none-any.whl") as wheel:
        assert "idempotency_gateway_client/py.typed" in wheel.namelist()
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    wheels = sorted(dist.glob("*.whl"))
    # --no-compile: no bytecode for every module of every dependency up front (seconds of
    # CPU); Python compiles what the checks below import, as it would without it.
    pip_install = ["-m", "pip", "install", "-q", "--no-compile"]
    run([venv / "bin" / "python", *pip_install, *wheels], cwd=tmp_path)
    return venv


@pytest.mark.slow  # builds two projects and installs them with their dependencies: ~1-2 min
async def test_the_built_packages_install_into_a_fresh_venv_and_run(
    tmp_path: Path,
    upstream: CountingUpstream,
    processes: list[GatewayProcess],
    request: pytest.FixtureRequest,
) -> None:
    venv = await asyncio.to_thread(build_and_install, tmp_path)
    outside = tmp_path / "user"  # nothing of this checkout on the path
    outside.mkdir()
    command = str(venv / "bin" / "idempotency-gateway")
    assert "serve the gateway" in run([command, "--help"], outside)
    assert "--config" in run([command, "serve", "--help"], outside)
    imported = run(
        [
            venv / "bin" / "python",
            "-c",
            "import gateway, idempotency_gateway_client as c; print(gateway.__file__, c.__file__)",
        ],
        outside,
    )
    assert str(ROOT) not in imported
    assert imported.count(str(venv)) == 2, imported

    # The installed gateway serves: a keyed request is forwarded once, then replayed.
    config = write_config(settings_for(tmp_path, upstream.url), outside / "gateway.toml")
    installed = GatewayProcess(
        config_path=config,
        env={"IDEMPOTENCY_GATEWAY_ADMIN__TOKEN": ADMIN_TOKEN},
        expects_admin=True,
        command=(command,),
        cwd=outside,
    )
    processes.append(installed)
    installed.start()
    async with aiohttp.ClientSession() as session:
        for replayed in ("false", "true"):
            async with session.post(
                f"{installed.url}/tickets/v1/issues",
                json={"title": "installed"},
                headers={"Idempotency-Key": "wheel-1"},
            ) as response:
                assert response.status == 201
                assert response.headers.get("Idempotent-Replayed", "false") == replayed
        async with session.get(
            f"{installed.admin_url}/admin/console.js",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response:
            assert response.status == 200, await response.text()
    assert upstream.count == 1

    # A user's strict mypy, pointed at the fresh venv, follows the client's types.
    (outside / "agent.py").write_text(
        "from idempotency_gateway_client import GatewayClient, derive_key\n"
        "\n"
        "key: str = derive_key('run-1', 0, 'c1')\n"
        "reveal_type(GatewayClient.lookup)\n"
    )
    mypy = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--python-executable",
        venv / "bin" / "python",
    ]
    cache = kept_mypy_cache(request, "packaging-mypy-installed", tmp_path)
    revealed = await asyncio.to_thread(run, [*mypy, "--cache-dir", cache, "agent.py"], outside)
    assert "idempotency_gateway_client._models.Operation | None" in revealed


def test_a_packed_typescript_client_leaves_the_checkout_clean() -> None:
    """`npm pack` (the TypeScript client's install step) writes its tarball into
    clients/typescript; it was left untracked in the checkout."""
    version = json.loads((ROOT / "clients" / "typescript" / "package.json").read_text())["version"]
    tarball = f"clients/typescript/idempotency-gateway-client-{version}.tgz"
    checked = subprocess.run(
        ["git", "check-ignore", "--no-index", "--quiet", tarball], cwd=ROOT, check=False
    )
    assert checked.returncode == 0, f"{tarball} is not ignored"
