"""A checkpoint's two slot files, `<path>.0` and `<path>.1`, as every trainer names them.

The host trainer hands the path to the C file storage (runtime_c/ub_storage_file.c); an
emulated trainer's driver sends its storage requests up the stream and `SlotFiles` answers
them with the same rules: a write is synced (and so is the folder of a file it created), and
no slot is opened through a symbolic link.
"""

from __future__ import annotations

import errno
import os

from ..errors import InputError

STORAGE_ERROR = -9  # UB_ERR_STORAGE


def slot_prefix(path, create: bool, max_bytes: int | None = None) -> bytes:
    """`path` as bytes (at most `max_bytes` long), its folder made first (`create`) or
    checked to exist."""
    try:
        prefix = os.fsencode(os.fspath(path))
    except TypeError:
        raise InputError(f"a checkpoint path must be a str, bytes or os.PathLike, not "
                         f"{type(path).__name__}") from None
    if max_bytes is not None and len(prefix) > max_bytes:
        raise InputError(f"the checkpoint path is {len(prefix)} bytes long; the file storage "
                         f"takes at most {max_bytes}: use a shorter path")
    folder = os.path.dirname(prefix) or b"."
    if create:
        make_folders(folder)
    elif not os.path.isdir(folder):
        raise InputError(f"no checkpoint at {os.fsdecode(prefix)!r}: the folder "
                         f"{os.fsdecode(os.path.abspath(folder))!r} does not exist")
    return prefix


def _sync(folder: bytes) -> None:
    fd = os.open(folder or b".", os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno != errno.EINVAL:  # some file systems cannot sync a directory
            raise
    finally:
        os.close(fd)


def make_folders(folder: bytes) -> None:
    """`folder` and its missing parents, each new entry synced to disk (a checkpoint whose
    folder vanished in a power loss would be lost though its save returned)."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for new in reversed(missing):
        try:
            os.mkdir(new)
        except FileExistsError:
            if not os.path.isdir(new):
                raise InputError(f"cannot make the checkpoint folder {os.fsdecode(new)!r}: a "
                                 "file of that name is in the way") from None
        except OSError as err:
            raise InputError(f"cannot make the checkpoint folder {os.fsdecode(new)!r}: "
                             f"{err.strerror}") from None
        _sync(os.path.dirname(os.path.abspath(new)))


class SlotFiles:
    """The storage of ub_storage.h over `<prefix>.<block>` files; each call returns a status
    (0, or UB_ERR_STORAGE) as the C file storage does."""

    def __init__(self, prefix: bytes):
        self.prefix = prefix

    def _path(self, block: int) -> bytes:
        return self.prefix + b".%d" % block

    def read(self, block: int, offset: int, n: int) -> tuple[int, bytes]:
        try:
            fd = os.open(self._path(block), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return STORAGE_ERROR, b""
        try:
            data = os.pread(fd, n, offset)
        except OSError:
            return STORAGE_ERROR, b""
        finally:
            os.close(fd)
        return (0, data) if len(data) == n else (STORAGE_ERROR, b"")

    def write(self, block: int, offset: int, data: bytes) -> int:
        path, created = self._path(block), False
        try:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                created = True
            try:
                done = 0
                while done < len(data):
                    done += os.pwrite(fd, data[done:], offset + done)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _sync(os.path.dirname(path))
        except OSError:
            return STORAGE_ERROR
        return 0
