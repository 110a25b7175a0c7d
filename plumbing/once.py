"""First-start work done once per cache, however many processes start at the same time.

A converted checkpoint or a compiled kernel is built by one process under an inter-process
lock while the others wait for it, then read the result. The builder writes into a temporary
folder of its own and publishes it with one ``rename``, so a folder under its final name is
always complete: a build killed half-way leaves only a temporary folder, which the next
builder removes. The lock is ``flock`` on a file beside the result; the kernel releases it
when its holder dies, so a dead builder's lock is taken over at once, never waited on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from plumbing.errors import StartupRefused

log = logging.getLogger("splitspec.cache")

POLL_S = 0.25  # how often a waiter tries the lock again
WAIT_LOG_EVERY_S = 30.0  # a waiter says it is still waiting this often

# Errors that mean "this folder cannot take the result" (full, read-only, not ours) rather
# than a bug in the build. safetensors and other native writers report them as text only.
STORAGE_ERRNOS = (
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EFBIG,
    errno.ENOTDIR,
)


class CacheWriteError(StartupRefused, RuntimeError):
    """The cache folder cannot be written; the message names it and SPLITSPEC_CACHE."""


def cache_write_error(folder: Path, err: BaseException) -> CacheWriteError:
    return CacheWriteError(
        f"cannot write the cache folder {folder}: {err}. splitspec keeps converted models and "
        "compiled kernels there (about 1 GiB for the default model); point SPLITSPEC_CACHE at "
        "a writable folder with free space, or free some"
    )


def is_storage_error(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
        return True
    text = str(err)
    return any(os.strerror(code) in text for code in STORAGE_ERRNOS)


def ensure_writable(folder: Path) -> None:
    """Creates ``folder`` and writes a probe file in it, or raises CacheWriteError."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(b"ok")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        raise cache_write_error(folder, err) from err


def build_once(final: Path, build: Callable[[Path], None], what: str) -> Path:
    """Returns ``final``, calling ``build(tmp_dir)`` first if no process has published it yet.

    ``build`` fills an empty temporary folder beside ``final``; it is renamed to ``final`` only
    after ``build`` returns. Concurrent callers for the same ``final`` wait on one lock, and only
    the first builds.
    """
    if final.exists():
        return final
    root = final.parent
    ensure_writable(root)
    with exclusive_lock(root / f".{final.name}.lock", what):
        if final.exists():  # published by the holder we waited for
            return final
        remove_leftovers(root, final.name)
        _build_and_publish(final, build, what)
    return final


def _build_and_publish(final: Path, build: Callable[[Path], None], what: str) -> None:
    root = final.parent
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=root))
        tmp.chmod(0o755)  # mkdtemp's 0700 would lock other users out of a shared cache
    except OSError as err:
        raise cache_write_error(root, err) from err
    started = time.monotonic()
    try:
        build(tmp)
        os.rename(tmp, final)  # atomic: the final name appears only with the whole result
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_storage_error(err):
            raise cache_write_error(root, err) from err
        raise
    log.info("%s: done in %.1f s (%s)", what, time.monotonic() - started, final)


def remove_leftovers(root: Path, name: str) -> None:
    """Removes temporary folders of killed builds of ``name``. Call only under its lock: every
    live builder holds that lock, so any temporary folder found then is a dead one's."""
    patterns = (f".{name}.tmp-*", f"{name}.tmp")  # the second: left by splitspec <= 0.1.0
    for pattern in patterns:
        for leftover in root.glob(pattern):
            log.warning("removing %s, left by a build that did not finish", leftover)
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, what: str) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``lock_path``, logging while it waits for another holder.

    The lock file is never deleted: deleting it while a waiter has it open would let a third
    process lock a new file of the same name beside the waiter.
    """
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise cache_write_error(lock_path.parent, err) from err
    try:
        _acquire(fd, lock_path, what)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _acquire(fd: int, lock_path: Path, what: str) -> None:
    if _try_lock(fd):
        return
    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    log.info("%s: waiting for %s, which is doing it now (lock %s)", what, holder, lock_path)
    started = last_said = time.monotonic()
    while not _try_lock(fd):
        time.sleep(POLL_S)
        now = time.monotonic()
        if now - last_said >= WAIT_LOG_EVERY_S:
            log.info("%s: still waiting (%.0f s)", what, now - started)
            last_said = now
    log.info("%s: the lock is free after %.1f s", what, time.monotonic() - started)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
