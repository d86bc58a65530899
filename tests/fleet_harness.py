"""What the fleet's tests share (test_fleet.py, test_fleet_int8.py): the digits demo's data
split, and a compiled project copied elsewhere, trained beside its original."""

import numpy as np


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
