"""What the fleet's tests share (test_fleet.py, test_fleet_int8.py, test_fleet_faults.py): the
digits demo's data split, a compiled project copied elsewhere, trained beside its original,
and one Flower run with processes of its own at a time across pytest-xdist's workers."""

import fcntl
import functools
import tempfile
from pathlib import Path

import numpy as np


def one_fleet_at_a_time(func):
    """`func` (a test or fixture that runs Flower in processes of its own: the deployment
    engine's SuperLink and SuperNodes, `ubitrain fleet` interrupted) holding a lock that the
    other worker's such runs wait on. The interrupted run never exited after Ctrl-C in three
    full-suite runs (while another worker ran the fleet's tests) and always did alone."""
    @functools.wraps(func)
    def locked(*args, **kwargs):
        with open(Path(tempfile.gettempdir()) / "ubitrain-fleet-tests.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return func(*args, **kwargs)  # the lock goes with the file
    return locked


def digits_shards(clients, seed=0):
    """The digits demo's data split IID over `clients`: (shards, test)."""
    from ubitrain.demos.data import load_data
    from ubitrain.fleet import split_dataset

    x_train, y_train, x_test, y_test = load_data(seed)
    return split_dataset(x_train, y_train, clients, None, seed), (x_test, y_test)


def copied_project(pkg, where):
    """The project's files (not its build directories) copied to `where`."""
    import shutil

    shutil.copytree(pkg.out_dir, where, ignore=shutil.ignore_patterns("build*"))
    return where


def same_training(original, loaded, steps=2):
    rng = np.random.default_rng(3)
    batch = original.package.inputs[0].shape
    for _ in range(steps):
        x = rng.standard_normal(batch).astype(np.float32)
        y = rng.integers(0, 10, batch[0])
        assert original.step(x, y) == loaded.step(x, y)
    a, b = original.parameters(), loaded.parameters()
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
