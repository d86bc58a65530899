"""The demos' data: scikit-learn's handwritten digits, split, batched, and scored."""

from __future__ import annotations

import numpy as np

from ..progress import bar

BATCH = 32
CLASSES = 10


def load_data(seed: int = 0, test_size: float = 0.25):
    """scikit-learn's digits (1,797 8x8 images, shipped with the package, no download):
    a stratified split, pixels standardized with the training set's statistics, shaped
    [N, 1, 8, 8] float32 with int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=seed)
    scaler = StandardScaler().fit(x_train)

    def prepare(a):
        return scaler.transform(a).astype(np.float32).reshape(-1, 1, 8, 8)

    return prepare(x_train), y_train, prepare(x_test), y_test


def epoch_batches(n: int, batch: int, epochs: int, seed: int) -> list[list[np.ndarray]]:
    """The index batches of every epoch, shuffled with a fixed seed. The step is compiled for
    one batch size, so the final partial batch of each epoch is dropped."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        perm = rng.permutation(n)
        out.append([perm[i:i + batch] for i in range(0, n - batch + 1, batch)])
    return out


def predict_padded(predict, x: np.ndarray, batch: int) -> np.ndarray:
    """Logits for every row of `x` from a predict function compiled for `batch` rows: the
    last batch is padded with zeros and the padding's logits are dropped."""
    logits = []
    for i in range(0, len(x), batch):
        chunk = x[i:i + batch]
        real = len(chunk)
        if real < batch:
            chunk = np.concatenate([chunk, np.zeros((batch - real,) + x.shape[1:], x.dtype)])
        logits.append(np.asarray(predict(chunk))[:real])
    return np.concatenate(logits)


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == y).mean())


def progress_bar(iterable, desc: str, enabled: bool):
    return bar(iterable, desc, None if enabled else False)
