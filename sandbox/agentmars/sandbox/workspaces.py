"""Session workspaces: where they live, their disk quota, a job's directory in one,
and their removal. Both backends run jobs in the directories made here.

Disk quota. Where the pool runs as root and the host can mount loop devices, each
workspace is an ext4 file system of its own, held in a sparse image file of
``workspace_quota_mb`` and loop-mounted on the workspace's path: a job that fills it
gets ENOSPC ("No space left on device") and nothing else fills up, neither the other
workspaces nor the disk the images are on (an image grows only to its quota). The
images live in ``<workspace_root>/.images`` (a session id cannot start with a dot);
closing a session unmounts and deletes its image, closing the pool unmounts them all
and keeps them (a reopened session mounts its image again). A pool killed hard leaves
its workspaces mounted: the next pool to start on the same root with no other pool
using it (a shared lock on ``<workspace_root>/.lock`` tells) unmounts them. Why this way: the host's
file system need not support project quotas (ext4 enables them only unmounted, with
``tune2fs -O project,quota``), a size-capped tmpfs would hold the files in memory
(and charge them to the slot's memory cgroup that the next session's jobs use), and
a periodic size check lets a job overshoot between checks.

Without root or loop devices, workspaces are plain directories with no quota, and
the pool says so in its warnings.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from agentmars.sandbox.spec import SandboxError, check_session_id

log = logging.getLogger(__name__)

IMAGES = ".images"
"""The folder of ``workspace_root`` holding the workspaces' file system images."""
COMMAND_TIMEOUT_S = 60.0
MKFS = ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard")
"""No reserved blocks (the whole quota is the workspace's) and no journal (32 MiB per
workspace otherwise; a workspace is scratch space: after a host crash it is fsck'd or
dropped)."""
MOUNT_OPTIONS = "loop,nodev,nosuid,noatime"
PROBE_MB = 8


class WorkspaceError(SandboxError):
    """A workspace could not be created, mounted or removed (the host's fault, not the
    caller's); the session stays as it was."""


def within(path: Path, root: Path) -> bool:
    """``path.is_relative_to(root)`` for absolute, normalized paths, at a fraction of
    its cost (this runs several times per job)."""
    inner, outer = str(path), str(root)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def resolve_cwd(workspace: Path, cwd: str) -> tuple[Path, Path]:
    """The workspace and the job's working directory, symlinks resolved; the working
    directory must be an existing directory inside the workspace."""
    try:
        root = workspace.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise SandboxError(f"workspace {workspace} does not exist") from exc
    try:
        target = root if cwd == "." else (root / cwd).resolve(strict=True)
    except RuntimeError as exc:  # Python 3.12 reports a symlink loop so, not as ELOOP
        raise SandboxError(f"cwd {cwd!r} is a symlink loop") from exc
    except OSError as exc:
        raise SandboxError(f"cwd {cwd!r} does not exist in the workspace") from exc
    if not within(target, root):
        raise SandboxError(f"cwd {cwd!r} resolves to {target}, outside the workspace")
    if not target.is_dir():
        raise SandboxError(f"cwd {cwd!r} is not a directory")
    return root, target


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it, however deep (``shutil.rmtree`` recurses
    once per level in Python 3.12 and stops at about 1,000), never following a symlink
    and never leaving the file system it is on; raises ``WorkspaceError`` if anything
    is left."""
    if not os.path.lexists(path):
        return
    # GNU rm walks with fts: no recursion limit, no symlink followed.
    removed = _run(["rm", "-rf", "--one-file-system", "--", str(path)])
    if removed is not None or os.path.lexists(path):
        raise WorkspaceError(f"cannot remove {path}: {removed or 'something is left'}")


def _run(argv: list[str]) -> str | None:
    """Run a host tool; None if it succeeded, else why not."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
    return None


class Workspaces:
    """The workspaces under ``root``, each ``root/<session id>``; with ``quota_mb``,
    each its own file system of that size where this host allows it (see the module
    docstring). Thread-safe: the pool calls it from worker threads."""

    def __init__(self, root: Path, quota_mb: int | None) -> None:
        self.root = root
        self.quota_mb = quota_mb
        self.quota_enabled = False
        self._lock = threading.Lock()
        self._mounted: set[Path] = set()
        """Workspaces this instance mounted and has not unmounted yet."""
        self._root_lock: int | None = None
        """A shared lock on ``root/.lock`` while quotas are on: pools using the root."""

    def start(self) -> list[str]:
        """Create the root; check that quotas can be set up here. Returns warnings."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.quota_mb is None:
            return []
        why = self._quota_unavailable()
        if why is not None:
            self._unlock_root()
            return [f"no disk quota per workspace ({why}): a job can fill the host's disk"]
        self.quota_enabled = True
        return []

    def _lock_root(self) -> None:
        """Hold a shared lock on the root; if no other pool holds one, unmount what a
        pool killed before it could left mounted."""
        self._root_lock = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._root_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another live pool: its mounts are its own
        else:
            for stale in (path for path in self.root.iterdir() if path.is_mount()):
                log.warning("unmounting %s, left mounted by a pool that was killed", stale)
                try:
                    self._unmount(stale)
                except WorkspaceError as exc:
                    log.error("%s", exc)
        fcntl.flock(self._root_lock, fcntl.LOCK_SH)

    def _unlock_root(self) -> None:
        if self._root_lock is not None:
            os.close(self._root_lock)
            self._root_lock = None

    def _quota_unavailable(self) -> str | None:
        if os.geteuid() != 0:
            return "mounting a file system per workspace needs root"
        missing = [tool for tool in (MKFS[0], "mount", "umount") if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not found; install e2fsprogs and mount"
        (self.root / IMAGES).mkdir(exist_ok=True, mode=0o700)
        self._lock_root()
        probe = Path(tempfile.mkdtemp(prefix=".probe-", dir=self.root))
        image = self.root / IMAGES / f"{probe.name}.img"
        try:
            self._create(probe, image, PROBE_MB)
            self._unmount(probe)
        except WorkspaceError as exc:
            return str(exc)
        finally:
            image.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                probe.rmdir()
        return None

    def path(self, session_id: str) -> Path:
        return self.root / check_session_id(session_id)

    def _image(self, session_id: str) -> Path:
        return self.root / IMAGES / f"{session_id}.img"

    def open(self, session_id: str) -> Path:
        """The session's workspace, created (or its image mounted again) if need be."""
        workspace = self.path(session_id)
        with self._lock:
            if not self.quota_enabled or workspace.is_mount():
                workspace.mkdir(exist_ok=True, mode=0o700)
            elif self._image(session_id).exists():
                workspace.mkdir(exist_ok=True, mode=0o700)
                self._mount(self._image(session_id), workspace)
            elif workspace.exists() and any(workspace.iterdir()):
                log.warning("workspace %s predates quotas: it has none", workspace)
            else:
                assert self.quota_mb is not None
                self._create(workspace, self._image(session_id), self.quota_mb)
        return workspace

    def remove(self, session_id: str) -> None:
        """Delete the workspace and its image; ``WorkspaceError`` if it cannot."""
        workspace = self.path(session_id)
        with self._lock:
            if workspace.is_mount():
                self._unmount(workspace)
            self._image(session_id).unlink(missing_ok=True)
            remove_tree(workspace)

    def release(self, session_id: str) -> None:
        """Unmount the workspace (its files stay in the image); no-op without quota."""
        workspace = self.path(session_id)
        with self._lock:
            if workspace.is_mount():
                self._unmount(workspace)

    def _create(self, workspace: Path, image: Path, size_mb: int) -> None:
        """A sparse image of ``size_mb`` with an empty ext4 file system, mounted on
        ``workspace``; on failure neither is left behind."""
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size_mb * 1024 * 1024)
        finally:
            os.close(fd)
        made_dir = not workspace.exists()
        try:
            failed = _run([*MKFS, str(image)])
            if failed is not None:
                raise WorkspaceError(f"cannot make a file system for {workspace}: {failed}")
            workspace.mkdir(exist_ok=True, mode=0o700)
            self._mount(image, workspace)
            (workspace / "lost+found").rmdir()  # fsck's, not the session's
            workspace.chmod(0o700)
        except BaseException:
            with contextlib.suppress(WorkspaceError):
                self._unmount(workspace)
            image.unlink(missing_ok=True)
            if made_dir:
                with contextlib.suppress(OSError):
                    workspace.rmdir()
            raise

    def _mount(self, image: Path, workspace: Path) -> None:
        failed = _run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(workspace)])
        if failed is not None:
            raise WorkspaceError(f"cannot mount the workspace {workspace}: {failed}")
        self._mounted.add(workspace)

    def _unmount(self, workspace: Path) -> None:
        if workspace.is_mount():
            failed = _run(["umount", str(workspace)])
            if failed is not None:
                raise WorkspaceError(f"cannot unmount the workspace {workspace}: {failed}")
        self._mounted.discard(workspace)

    def close(self) -> None:
        """Unmount the workspaces this instance mounted (their files stay in their
        images, for a later ``open``)."""
        with self._lock:
            for workspace in list(self._mounted):
                try:
                    self._unmount(workspace)
                except WorkspaceError as exc:
                    log.error("%s", exc)
            self._unlock_root()
