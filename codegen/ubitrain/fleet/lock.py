"""One fleet run an out-dir at a time. A run compiles its projects, writes the shards and
checkpoints and loads its libraries from the out-dir; a second run there would rebuild them
under the first (whose clients then fail to load a library the rebuild replaced, round
after round). The second run is refused up front instead. The lock is the kernel's
(flock), so it dies with its process: a killed run leaves nothing to clean up."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from ..errors import UbitrainError

LOCK_FILE = ".fleet.lock"


@contextmanager
def out_dir_lock(out_dir: Path):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    f = open(out_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise UbitrainError(f"out_dir {str(out_dir)!r} is in use by another fleet run "
                            f"({holder}); its projects, shards and checkpoints are there: give "
                            "this run another --out-dir, or wait for that one to end") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        yield
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()
