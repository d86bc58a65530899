"""Flower's ArrayRecord <-> dicts of numpy arrays (dtypes kept: float32, int8, int32, int64)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord


def as_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def as_record(tensors: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in tensors.items()})
