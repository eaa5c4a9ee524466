"""Workspaces on the real host: the disk quota (a loop-mounted file system each, as
root), removal of any tree, and what a pool killed hard leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecSpec
from agentmars.sandbox.workspaces import IMAGES, WorkspaceError

from .conftest import MakePool

MB = 1024 * 1024
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="quotas mount file systems: root")


def write_mb(name: str, size_mb: int) -> ExecSpec:
    return ExecSpec(command=["dd", "if=/dev/zero", f"of={name}", "bs=1M", f"count={size_mb}"])


async def quota_pool(make_pool: MakePool, quota_mb: int = 32) -> SandboxPool:
    pool = await make_pool(slots=2, workspace_quota_mb=quota_mb)
    if any("no disk quota" in warning for warning in pool.warnings):
        pytest.skip(f"no quota on this host: {pool.warnings}")
    return pool


@needs_root
async def test_a_job_past_its_quota_gets_enospc_and_nothing_else_fills(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = await quota_pool(make_pool, quota_mb=32)
    pool.open_session("hog")
    pool.open_session("other")
    hog = await pool.run("hog", write_mb("big", 64))
    assert hog.status == "error" and "No space left on device" in hog.stderr, hog
    other = await pool.run("other", write_mb("mine", 8))
    assert other.status == "ok", other
    # What the hog took of the host's disk: its image, which never grows past the quota.
    image = tmp_path / "ws" / IMAGES / "hog.img"
    assert image.stat().st_size == 32 * MB and image.stat().st_blocks * 512 <= 32 * MB


@pytest.mark.parametrize("quota_mb", [None, 64])
async def test_a_2000_deep_tree_is_removed_and_the_id_reopens_empty(
    make_pool: MakePool, quota_mb: int | None
) -> None:
    pool = await make_pool(workspace_quota_mb=quota_mb)
    workspace = pool.open_session("deep")
    deep = "import os\nfor _ in range(2000):\n    os.mkdir('d')\n    os.chdir('d')"
    assert (await pool.run("deep", ExecSpec(command=["python", "-c", deep]))).status == "ok"
    await pool.close_session("deep")
    assert not workspace.exists() and pool.sessions == []
    assert os.listdir(pool.open_session("deep")) == []


async def test_a_workspace_that_cannot_be_removed_keeps_its_session(
    make_pool: MakePool,
) -> None:
    pool = await make_pool(workspace_quota_mb=None)
    workspace = pool.open_session("s")
    (workspace / "pinned").write_text("")
    if subprocess.run(["chattr", "+i", workspace / "pinned"], check=False).returncode != 0:
        pytest.skip("cannot make a file immutable here")
    try:
        with pytest.raises(WorkspaceError, match="cannot remove"):
            await pool.close_session("s")
        assert pool.sessions == ["s"] and (workspace / "pinned").exists()
    finally:
        subprocess.run(["chattr", "-i", workspace / "pinned"], check=True)
    await pool.close_session("s")  # closing again retries
    assert pool.sessions == [] and not workspace.exists()


@needs_root
async def test_a_kept_workspace_is_unmounted_and_comes_back_from_its_image(
    make_pool: MakePool,
) -> None:
    pool = await quota_pool(make_pool)
    workspace = pool.open_session("s")
    assert (await pool.run("s", ExecSpec(command=["sh", "-c", "echo kept > f"]))).status == "ok"
    await pool.close_session("s", remove_workspace=False)
    assert not workspace.is_mount() and not (workspace / "f").exists()
    assert (pool.open_session("s") / "f").read_text() == "kept\n"


@needs_root
async def test_mounts_a_killed_pool_left_are_unmounted_by_the_next_pool(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    killed = textwrap.dedent(
        f"""
        import asyncio, os
        from pathlib import Path
        from agentmars.sandbox.config import SandboxConfig
        from agentmars.sandbox.pool import SandboxPool

        async def main():
            pool = await SandboxPool(SandboxConfig(workspace_root=Path({str(root)!r}))).start()
            (pool.open_session("s") / "f").write_text("survived")
            os._exit(0)  # as if killed: nothing closed

        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", killed], check=True, timeout=60)
    if not (root / "s").is_mount():
        pytest.skip("no quota on this host: nothing was mounted")
    async with SandboxPool(SandboxConfig(workspace_root=root)) as pool:
        assert not (root / "s").is_mount()  # the stale mount is gone
        assert (pool.open_session("s") / "f").read_text() == "survived"
    assert not (root / "s").is_mount()
