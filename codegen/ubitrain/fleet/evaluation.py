"""The server's evaluation of a global model on its test set: accuracy and cross-entropy, from
the compiled predict step (which takes a fixed batch: the last one is padded)."""

from __future__ import annotations

import numpy as np


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


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean())


def model_metrics(trainer, test, tensors=None) -> dict:
    """Test accuracy and loss of `trainer` on `test` = (x, y), after loading `tensors` if
    given; no metrics without a test set."""
    if tensors is not None:
        trainer.load_parameters(tensors)
    if test is None:
        return {}
    x, y = test
    logits = predict_padded(trainer.predict, x, trainer.package.inputs[0].shape[0])
    return {"accuracy": float((logits.argmax(axis=1) == y).mean()),
            "loss": cross_entropy(logits, y)}
