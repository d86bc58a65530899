"""int8 (NITI) clients in a fleet: what travels, how the server merges it exactly in integers,
and one client's round.

What travels. Down, the global model: each parameter's integer values (an int8 weight, an
int32 bias), its exponent under `<name>.exponent` (int32 [1]; value x 2^exponent) and
`niti.step` (int64 [1]), the steps the fleet has completed. Up, from each client: its int8
weights and exponents after the round, with `num-examples` and `local-steps` in its metrics.
A client keeps nothing between rounds: it loads the weights and exponents, zeroes its
rescale sites (adaptive rescaling's shifts and intervals are a local cache, rebuilt by the
first step) and sets its count of completed steps to `niti.step`.

The step counter counts the steps of the whole fleet: each round adds the local steps of the
clients that replied. After R rounds it equals the steps of central training on as many
samples, so one NITI schedule (mu by completed steps) means the same in both.

The merge, `integer_fedavg`, per weight over the K replies (sample counts n_k, N = sum n_k,
int8 values q_k, exponents e_k), in exact integer arithmetic:

    lo = min e_k,  E = max e_k,  D = N * 2^(E - lo)
    S  = sum_k n_k * q_k * 2^(e_k - lo)            (int64; the mean weight is S/D x 2^E)
    q  = S/D rounded to an integer, at exponent E

`rounding="nearest"`: to nearest, ties to even. `rounding="stochastic"`: floor(S/D) + 1 with
probability (S mod D)/D, the draw u < S mod D of u uniform in [0, D), from numpy's
default_rng((seed, round)), one draw per element, weights in sorted name order. |S| <= L D
for the type's bound L (127 for int8), so q stays in the type with no clipping. NITI never
changes a weight's exponent in training (its update moves int8 values), so clients that
start a round from the same model return the same exponents: then E = lo = e_k, D = N, and
the global exponents stay those of the initial model, as in central training."""

from __future__ import annotations

import numpy as np
from flwr.serverapp.strategy import FedAvg

from ..errors import UbitrainError
from ..runtime.int8_trainer import EXPONENT, LIMITS
from .local import LocalTraining, batch_indices
from .records import as_numpy, as_record

STEP = "niti.step"
ROUNDINGS = ("nearest", "stochastic")


def is_int8(trainer) -> bool:
    return getattr(trainer.package, "precision", "fp32") == "int8"


def exchanged_int8_names(trainer, sparse: bool) -> list[str]:
    """The weights that travel (with a sparse update only the trained ones: the frozen ones
    never change); each with its exponent."""
    trained = set(trainer.package.trainable)
    return [key for name in trainer.package.integer_parameters
            if not sparse or name in trained for key in (name, name + EXPONENT)]


def initial_int8_model(trainer, names: list[str]) -> dict[str, np.ndarray]:
    """The global model of round 0: the trainer's int8 weights, exponents, no steps done."""
    weights = trainer.int8_parameters()
    return {**{k: weights[k] for k in names}, STEP: np.zeros(1, np.int64)}


def without_step(tensors: dict) -> dict:
    """The weights and exponents of a global model, as load_parameters takes them."""
    return {k: v for k, v in tensors.items() if k != STEP}


def int8_local_round(trainer, global_model: dict, x: np.ndarray, y: np.ndarray,
                     spec: LocalTraining, seed: int):
    """(int8 weights and exponents, mean loss): the global model loaded, the NITI state
    zeroed at the fleet's step count, `spec.steps` steps on the client's shard."""
    trainer.load_parameters(without_step(global_model))
    trainer.reset_optimizer_state(step=int(global_model[STEP][0]))
    losses = [trainer.step(x[idx], y[idx])
              for idx in batch_indices(len(x), spec.steps, spec.batch,
                                       np.random.default_rng(seed))]
    weights = trainer.int8_parameters()
    return {k: weights[k] for k in without_step(global_model)}, float(np.mean(losses))


def _checked(updates: list[tuple[dict, int]]) -> list[str]:
    """The weight names, after checking that every reply has int8 weights and an integer
    exponent for each, and a positive sample count."""
    if not updates:
        raise UbitrainError("integer_fedavg: no client replied; nothing to merge")
    keys = sorted(updates[0][0])
    names = [k for k in keys if not k.endswith(EXPONENT)]
    for i, (tensors, n) in enumerate(updates):
        if sorted(tensors) != keys:
            raise UbitrainError(f"integer_fedavg: reply {i} holds {sorted(tensors)}; reply 0 "
                                f"holds {keys}: every client must send the same weights")
        if int(n) < 1:
            raise UbitrainError(f"integer_fedavg: reply {i} trained on {n} samples")
        for name in names:
            if tensors[name].shape != updates[0][0][name].shape:
                raise UbitrainError(f"integer_fedavg: reply {i} sends {name} of shape "
                                    f"{list(tensors[name].shape)}, reply 0 of shape "
                                    f"{list(updates[0][0][name].shape)}")
            exponent = tensors.get(name + EXPONENT)
            if tensors[name].dtype not in LIMITS or exponent is None or \
                    np.asarray(exponent).dtype.kind not in "iu" or np.size(exponent) != 1:
                raise UbitrainError(
                    f"integer_fedavg: reply {i} sends {name} as {tensors[name].dtype} with "
                    f"exponent {exponent!r}; an int8 fleet exchanges int8 weights (int32 "
                    f"biases), each with one integer exponent under {name + EXPONENT!r} (an "
                    "fp32 client in an int8 fleet?)")
            if tensors[name].dtype != updates[0][0][name].dtype:
                raise UbitrainError(f"integer_fedavg: reply {i} sends {name} as "
                                    f"{tensors[name].dtype}, reply 0 as "
                                    f"{updates[0][0][name].dtype}")
    return names


def integer_fedavg(updates: list[tuple[dict, int]], rounding: str = "nearest",
                   seed: tuple[int, int] = (0, 0)) -> dict[str, np.ndarray]:
    """The sample-weighted mean of integer parameters, exactly, rounded back to their type
    at the largest client exponent (module docstring). `updates`: (integer values and exponents,
    sample count) per client; `seed`: (fleet seed, round) of stochastic rounding."""
    if rounding not in ROUNDINGS:
        raise UbitrainError(f"rounding={rounding!r}: choose one of {', '.join(ROUNDINGS)}")
    names = _checked(updates)
    counts = [int(n) for _, n in updates]
    total = sum(counts)
    rng = np.random.default_rng(seed) if rounding == "stochastic" else None
    merged = {}
    for name in names:
        exps = [int(np.asarray(t[name + EXPONENT]).reshape(-1)[0]) for t, _ in updates]
        lo, top = min(exps), max(exps)
        dtype = updates[0][0][name].dtype
        if LIMITS[dtype] * total * 2.0 ** (top - lo) >= 2.0 ** 62:
            raise UbitrainError(f"integer_fedavg: the clients' exponents of {name} span "
                                f"{lo} to {top}; the exact sum of {total} samples' weights "
                                "needs more than 62 bits. Clients of one fleet should start "
                                "each round from the same global model (one exponent)")
        total_sum = np.zeros(updates[0][0][name].shape, np.int64)
        for (tensors, _), n, e in zip(updates, counts, exps):
            total_sum += n * (tensors[name].astype(np.int64) << (e - lo))
        divisor = total << (top - lo)
        low = total_sum // divisor  # floor
        rest = total_sum - low * divisor  # in [0, divisor)
        if rng is None:
            up = (2 * rest > divisor) | ((2 * rest == divisor) & (low % 2 == 1))
        else:
            up = rng.integers(0, divisor, size=rest.shape, dtype=np.int64) < rest
        merged[name] = (low + up).astype(dtype)
        merged[name + EXPONENT] = np.array([top], np.int32)
    return merged


class Int8FedAvg(FedAvg):
    """Flower's FedAvg with the merge done by integer_fedavg: every client of the next round
    gets the same int8 weights and exponents, and the fleet's step count (`niti.step`) grows
    by the local steps of the clients that replied."""

    def __init__(self, *, rounding: str = "nearest", seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if rounding not in ROUNDINGS:
            raise UbitrainError(f"rounding={rounding!r}: choose one of {', '.join(ROUNDINGS)}")
        self.rounding, self.seed, self.sent_step = rounding, seed, 0

    def configure_train(self, server_round, arrays, config, grid):
        self.sent_step = int(arrays[STEP].numpy()[0])
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        valid, _ = self._check_and_log_replies(list(replies), is_train=True)
        if not valid:
            return None, None
        contents = [m.content for m in valid]
        metrics = [next(iter(c.metric_records.values())) for c in contents]
        updates = [(as_numpy(c.array_records[self.arrayrecord_key]), int(m[self.weighted_by_key]))
                   for c, m in zip(contents, metrics)]
        merged = integer_fedavg(updates, self.rounding, (self.seed, server_round))
        steps = sum(int(m["local-steps"]) for m in metrics)
        merged[STEP] = np.array([self.sent_step + steps], np.int64)
        return as_record(merged), self.train_metrics_aggr_fn(contents, self.weighted_by_key)
