"""What a user gets from ``pip install``.

- The extras give version ranges: an exact pin would downgrade a user's newer release
  (issue 40: ``openhands-sdk==1.58.0`` replaced 1.58.2). Exact pins live in
  requirements/main.lock only.
- The built wheel (``pip install <clone>``, not ``-e``), installed into a fresh venv,
  starts a sandbox pool and runs a tool. Issue 40: the wheel lacked
  ``seccomp_filter.c``, so every pool start failed with FileNotFoundError.

The fresh venv sees the main venv's site-packages for the dependencies (through a
``.pth`` line, which does not run the main venv's editable finder), so agentmars itself
comes only from the wheel; the test checks that it does."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RUN_A_TOOL = """
import asyncio, sys
import agentmars.sandbox
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecSpec

assert agentmars.sandbox.__path__[0].startswith(sys.prefix), agentmars.sandbox.__path__

async def main() -> None:
    pool = await SandboxPool(SandboxConfig(workspace_root=sys.argv[1])).start()
    try:
        pool.open_session("s")
        result = await pool.run("s", ExecSpec(command=["echo", "from the wheel"]))
        print(result.status, result.stdout.strip())
    finally:
        await pool.close()

asyncio.run(main())
"""


def test_no_requirement_is_pinned_exactly() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    requirements = [*project["dependencies"], *(r for group in extras.values() for r in group)]
    requirements += [
        line
        for line in (ROOT / "requirements" / "openhands-tools.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert requirements
    assert [r for r in requirements if "==" in r.split(";")[0]] == []


def _tracked_files(into: Path) -> None:
    """The clone's tracked files (as committed or edited), so the build writes nothing
    into the clone."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (raw.decode() for raw in listed)):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


@pytest.mark.slow
def test_the_wheel_starts_a_sandbox_and_runs_a_tool(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("needs the git clone to list the project's files")
    source, wheels, venv = tmp_path / "src", tmp_path / "wheels", tmp_path / "venv"
    _tracked_files(source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], check=True
    )
    (wheel,) = wheels.glob("agentmars-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "agentmars/sandbox/backends/seccomp_filter.c" in names
    assert "agentmars/sandbox/backends/sandbox_init.c" in names

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)

    ran = subprocess.run(
        [python, "-c", RUN_A_TOOL, tmp_path / "ws"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "ok from the wheel"
