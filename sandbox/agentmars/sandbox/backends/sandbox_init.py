"""The sandbox init (``sandbox_init.c``): the process backend's host shim, the
sandbox's pid 1 and the maker of the slots' network namespaces, one small static C
program (see the process backend's docstring).

It is built on first use with the system C compiler into
``~/.cache/agentmars/sandbox-init/<key>/sandbox-init``, the key being the SHA-256 of
the source and the compiler flags, so a changed source is built anew and never mistaken
for an old build (``build_program``, which the seccomp filter's generator is built
with too). ``make env`` builds it ahead (``python -m
agentmars.sandbox.backends.sandbox_init``), so no timed run compiles.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from agentmars.sandbox.spec import SandboxError

SOURCE = Path(__file__).with_name("sandbox_init.c")
CFLAGS = ("-O2", "-static", "-Wall", "-Wextra")
"""Static: a job's exec of it loads no shared library and reads no environment."""
NEEDED = "install gcc and libc6-dev (Debian packages; see scripts/apt-packages.txt)"
BUILD_TIMEOUT_S = 120.0


def cache_root() -> Path:
    return Path.home() / ".cache" / "agentmars" / "sandbox-init"


def cache_key(source: bytes, flags: tuple[str, ...] = CFLAGS) -> str:
    digest = hashlib.sha256(source)
    for flag in flags:
        digest.update(b"\0" + flag.encode())
    return digest.hexdigest()


def ensure_built(compiler: str = "cc") -> Path:
    """The built init for the current source: from the cache, else compiled with
    ``compiler`` (a name looked up on PATH, or a path)."""
    return build_program(SOURCE, "sandbox-init", compiler, what="sandbox init", needed=NEEDED)


def build_program(
    source_file: Path,
    name: str,
    compiler: str,
    *,
    what: str,
    needed: str,
    flags: tuple[str, ...] = CFLAGS,
    libraries: tuple[str, ...] = (),
) -> Path:
    """``cache_root()/<key>/name``, compiled from ``source_file`` with ``flags`` and
    linked with ``libraries`` unless a build of the same source and flags is there;
    ``what`` and ``needed`` say, in an error, what failed and what to install."""
    source = source_file.read_bytes()
    binary = cache_root() / cache_key(source, flags + libraries) / name
    if binary.is_file():
        return binary
    found = shutil.which(compiler)
    if found is None:
        raise SandboxError(
            f"no C compiler found ({compiler!r}): the process backend builds its {what} "
            f"from {source_file.name} with one; {needed}"
        )
    argv = [found, *flags, "-o", "{output}", "-x", "c", "-", "-x", "none", *libraries]
    _compile(argv, source, binary, what, needed)
    return binary


def _compile(argv: list[str], source: bytes, binary: Path, what: str, needed: str) -> None:
    """Compile ``source`` (the bytes the key was computed from, on stdin) with ``argv``
    into ``binary`` (by way of ``written_in_place``)."""
    binary.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with written_in_place(binary) as temporary:
        argv = [str(temporary) if arg == "{output}" else arg for arg in argv]
        try:
            built = subprocess.run(argv, input=source, capture_output=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"building the {what} took over {exc.timeout:g} s") from exc
        if built.returncode != 0:
            raise SandboxError(
                f"cannot build the {what} ({' '.join(argv)}): "
                f"{built.stderr.decode(errors='replace').strip()}; {needed}"
            )
        os.chmod(temporary, 0o755)


@contextlib.contextmanager
def written_in_place(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write, renamed onto ``path`` if the block
    ends without an error and removed either way: a process racing this one, or one
    killed midway, never leaves a partial file under the final name."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".writing-")
    os.close(fd)
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


if __name__ == "__main__":
    print(ensure_built())
