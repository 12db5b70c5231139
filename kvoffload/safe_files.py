"""Files inside a cache directory that others may write, opened so nothing outside it changes.

A shared directory (the fs tier's, or a disk tier pointed at one) can be written by a co-tenant:
a symlink planted at a name the tier opens would make it truncate, overwrite or touch whatever
file the engine's user can write; a FIFO would block it; a hard link would let it rewrite a file
it never created. So every name is opened relative to a directory descriptor the tier holds,
never following a symlink (``O_NOFOLLOW``), without blocking (``O_NONBLOCK``), and kept only when
it is a regular file with one link; new files are created exclusively (``O_EXCL``) under random
names and renamed into place, which replaces a planted name instead of writing through it.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_warned: set[str] = set()


class ForeignEntryError(OSError):
    """A name the tier opens is a symlink, FIFO, directory or hard-linked file: not ours.
    ``strerror`` says which ("a symlink", "a FIFO", ...), ``filename`` names it."""


def describe(st: os.stat_result) -> str:
    """What a foreign entry is, for messages."""
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISREG(st.st_mode):
        return f"a file with {st.st_nlink} hard links"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    return "not a regular file"


def is_own_file(st: os.stat_result) -> bool:
    """A regular file with one link: the only kind the tiers read, write or touch."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def open_file(name: str | os.PathLike[str], flags: int, dir_fd: int | None = None, mode: int = 0o666) -> int:
    """``name`` opened without following a symlink or blocking on a FIFO; raises
    ForeignEntryError unless it is a regular file with one link (FileNotFoundError as usual)."""
    try:
        fd = os.open(name, flags | _NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        try:
            what = describe(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
        except OSError:
            what = "not a regular file"  # gone meanwhile: what it was no longer matters
        raise ForeignEntryError(exc.errno, what, str(name)) from None
    st = os.fstat(fd)
    if not is_own_file(st):
        os.close(fd)
        raise ForeignEntryError(errno.ELOOP, describe(st), str(name))
    return fd


def open_dir(name: str | os.PathLike[str], dir_fd: int | None = None) -> int:
    """A directory descriptor for ``name``; a symlink there raises ForeignEntryError."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ForeignEntryError(exc.errno, "a symlink or file where a directory belongs", str(name)) from None
        raise


def temp_name(stem: str) -> str:
    """A fresh temporary name beside ``stem``: random, so nobody can plant it beforehand."""
    return f"{stem}.{secrets.token_hex(8)}.tmp"


def create_exclusive(name: str, dir_fd: int | None = None, mode: int = 0o666) -> int:
    """A new file, created by this call (never an existing name, link or FIFO)."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode, dir_fd=dir_fd)


def replace_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole through an exclusive temporary and a rename (which replaces a planted
    symlink at ``path`` instead of writing through it)."""
    temp = path.parent / temp_name(f".{path.name}")
    fd = create_exclusive(str(temp), mode=mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def read_file(name: str | os.PathLike[str], dir_fd: int | None = None, limit: int = 1 << 20) -> bytes:
    """A small file of ours read whole, up to ``limit`` bytes (ForeignEntryError for anything
    else)."""
    fd = open_file(name, os.O_RDONLY, dir_fd)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def remove_entry(name: str, dir_fd: int | None = None) -> None:
    """Remove a name (a file, link or FIFO; an empty directory), never what a link points at."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except IsADirectoryError:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def warn_if_shared_with_others(path: Path, what: str) -> bool:
    """One warning per directory when users other than this one (and root) can write it: they
    could plant names there. True if warned."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    others = st.st_mode & stat.S_IWOTH or st.st_uid not in (os.geteuid(), 0)
    key = str(path)
    if not others or key in _warned:
        return False
    _warned.add(key)
    owner = f"its owner (uid {st.st_uid})" if st.st_uid not in (os.geteuid(), 0) else "any user"
    logger.warning("kvoffload: %s %s (mode %s) can be written by %s, not only this user: planted names are refused, "
                   "but anyone who can write it can delete or replace cached records; chmod o-w it, or use a directory "
                   "owned by the engines' user and group", what, path, oct(stat.S_IMODE(st.st_mode)), owner)
    return True


def note_foreign(where: str, exc: OSError) -> None:
    """A foreign entry found at run time: one warning per place, then debug lines."""
    if where in _warned:
        logger.debug("kvoffload: %s: %s", where, exc)
        return
    _warned.add(where)
    logger.warning("kvoffload: %s: %s is %s: removed and not followed (someone else writes this directory; see the "
                   "start-up warning)", where, exc.filename, exc.strerror)
