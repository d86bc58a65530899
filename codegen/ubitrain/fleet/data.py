"""scikit-learn's digits split over a fleet's clients: each client holds its own shard and
never shows it to anyone; the server holds the test set."""

from __future__ import annotations

import numpy as np

from ..demos.data import load_data
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


def digits_fleet(clients: int, alpha: float | None, seed: int = 0):
    """(shards, (x_test, y_test)): shards[i] = (x, y) of client i, from the demo's split of
    the digits (standardized 1x8x8 images, int64 labels)."""
    x_train, y_train, x_test, y_test = load_data(seed)
    parts = label_split(y_train, clients, alpha, seed)
    return [(x_train[p], y_train[p]) for p in parts], (x_test, y_test)
