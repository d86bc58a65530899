"""A fleet's data: each client holds its own shard and never shows it to anyone; the server
holds the test set. A data set split over simulated clients (IID, or by label), the shards'
checks against each other, and each shard in a file of its own, which is all a client reads
(in the simulation and under the deployment engine alike)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UbitrainError


def label_split(labels: np.ndarray, clients: int, alpha: float | None,
                seed: int) -> list[np.ndarray]:
    """Indices of each client's samples. `alpha=None`: a shuffled even split (IID). Otherwise
    each class is spread over the clients in proportions drawn from Dirichlet(alpha): small
    alpha gives each client few classes. Every client gets at least one sample."""
    if clients < 1 or clients > len(labels):
        raise UbitrainError(f"--clients {clients}: give 1 to {len(labels)} clients (one "
                            "training sample each at least)")
    if alpha is not None and not alpha > 0:
        raise UbitrainError(f"--non-iid {alpha}: the Dirichlet concentration must be > 0 "
                            "(small: skewed labels, large: nearly IID)")
    rng = np.random.default_rng(seed)
    if alpha is None:
        return [np.sort(s) for s in np.array_split(rng.permutation(len(labels)), clients)]
    shards: list[list[int]] = [[] for _ in range(clients)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        cuts = (np.cumsum(rng.dirichlet([alpha] * clients)) * len(members)).astype(int)[:-1]
        for shard, part in zip(shards, np.split(members, cuts)):
            shard.extend(part.tolist())
    for shard in shards:  # an empty client borrows from the largest one
        if not shard:
            donor = max(shards, key=len)
            shard.append(donor.pop())
    return [np.sort(np.array(s, np.int64)) for s in shards]


def split_dataset(x: np.ndarray, y: np.ndarray, clients: int, alpha: float | None,
                  seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(x, y) of each client: `label_split` of the samples."""
    return [(x[p], y[p]) for p in label_split(np.asarray(y), clients, alpha, seed)]


def _pair(data, what: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise UbitrainError(f"{what} must be a pair (x, y) of arrays, got "
                            f"{type(data).__name__}")
    x, y = (np.asarray(a.detach() if hasattr(a, "detach") else a) for a in data)
    if x.ndim < 1 or len(x) < 1:
        raise UbitrainError(f"{what}: x has shape {list(x.shape)}; give at least one sample "
                            "along its first dimension")
    if y.shape != (len(x),) or y.dtype.kind not in "iu":
        raise UbitrainError(f"{what}: y is {y.dtype} {list(y.shape)}; give one integer class "
                            f"label per sample of x, shape [{len(x)}]")
    if y.min() < 0:
        raise UbitrainError(f"{what}: a label is {y.min()}; class labels start at 0")
    if x.dtype.kind != "f":
        raise UbitrainError(f"{what}: x is {x.dtype}; give float samples")
    return np.ascontiguousarray(x, np.float32), np.ascontiguousarray(y, np.int64)


def checked_data(client_data, test_data):
    """The clients' (x, y) pairs and the test pair (or None) as float32 samples and int64
    labels, after checking that they are pairs of arrays whose samples share one shape."""
    if not isinstance(client_data, (list, tuple)) or not client_data:
        raise UbitrainError("client_data must be a non-empty list of (x, y) pairs, one per "
                            "client")
    shards = [_pair(d, f"client_data[{i}]") for i, d in enumerate(client_data)]
    test = _pair(test_data, "test_data") if test_data is not None else None
    shape = shards[0][0].shape[1:]
    for what, (x, _) in [(f"client_data[{i}]", s) for i, s in enumerate(shards)] + \
            ([("test_data", test)] if test is not None else []):
        if x.shape[1:] != shape:
            raise UbitrainError(f"{what}: samples of shape {list(x.shape[1:])}; "
                                f"client_data[0]'s are {list(shape)}: every sample of a fleet "
                                "has the same shape")
    return shards, test


def classes_in(shards, test) -> int:
    """1 + the largest label any client or the test set holds."""
    return 1 + max(int(y.max()) for _, y in shards + ([test] if test is not None else []))


def shard_file(directory: Path, client: int) -> Path:
    return Path(directory) / f"client_{client:05d}.npz"


def save_shards(directory: Path, shards, test) -> None:
    """Each client's (x, y) in its own file (and the test set in test.npz)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("client_*.npz"):
        stale.unlink()
    for i, (x, y) in enumerate(shards):
        np.savez(shard_file(directory, i), x=x, y=y)
    if test is not None:
        np.savez(directory / "test.npz", x=test[0], y=test[1])


def load_shard(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as f:
        return f["x"], f["y"]
