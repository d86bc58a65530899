"""NITI's integer BatchNorm as TE kernels: niti/batch_norm.py's rules, bit for bit.

Per channel the statistics are int64 reductions; the square root is integer Newton steps
from a power of two above it (each a stage: nested, TVM's simplifier takes minutes), then
one correction down to the floor; every division rounds half away from zero.
"""

from __future__ import annotations

from tvm import te, tirx

from ..niti.batch_norm import MOMENTUM_BITS, ROOT_BITS, F
from .niti_kernels import I32, I64, _sign_mag, _signed, clip8, i32, i64
from .tir_lower import KEEP_STAGE

NEWTON_STEPS = 7  # from at most twice the root, the error squares each step: 2^-64 < 1
INT32_LIMIT = 2**31 - 1


def round_div(a, b):
    """int64 a / b rounded half away from zero, 0 where b <= 0."""
    neg, mag = _sign_mag(a)
    safe = tirx.max(b, i64(1))
    q = tirx.truncdiv(mag + tirx.truncdiv(safe, i64(2)), safe)
    return tirx.Select(b > i64(0), _signed(neg, q), i64(0))


def _channel_bitlen(v, name):
    """Bits of each non-negative int64 of the [C] tensor v."""
    k = te.reduce_axis((0, 63), name=name + "_k")
    return te.compute(v.shape, lambda c: te.sum(tirx.Select(
        (v[c] >> k.astype(I64)) > i64(0), i32(1), i32(0)), axis=k), name=name)


def root(v, name: str):
    """(isqrt(v 4^g), g) per channel of the non-negative int64 [C] tensor v."""
    bits = _channel_bitlen(v, name + "_vbits")
    g = te.compute(v.shape, lambda c: tirx.max(tirx.min(
        tirx.truncdiv(i32(62) - bits[c], i32(2)), i32(ROOT_BITS)), i32(0)), name=name + "_g",
        attrs={KEEP_STAGE: 1})
    scaled = te.compute(v.shape, lambda c: v[c] << (i64(2) * g[c].astype(I64)),
                        name=name + "_scaled", attrs={KEEP_STAGE: 1})
    sbits = _channel_bitlen(scaled, name + "_sbits")
    x = te.compute(v.shape, lambda c: i64(1) << tirx.truncdiv(sbits[c] + i32(1), i32(2))
                   .astype(I64), name=name + "_x0", attrs={KEEP_STAGE: 1})
    for step in range(NEWTON_STEPS):  # (x + v / x) / 2: down to floor(sqrt) or one above
        x = _newton_step(x, scaled, f"{name}_x{step + 1}")
    r = te.compute(v.shape, lambda c: x[c] - tirx.Select(x[c] * x[c] > scaled[c], i64(1),
                                                          i64(0)), name=name)
    return r, g


def _newton_step(x, scaled, name):
    return te.compute(x.shape, lambda c: tirx.Select(
        x[c] > i64(0), (x[c] + tirx.truncdiv(scaled[c], tirx.max(x[c], i64(1)))) >> i64(1),
        i64(0)), name=name, attrs={KEEP_STAGE: 1})


def _channel_sums(q, name):
    """(n, s1, s2): int64 sums per channel (dimension 1) of int8 q."""
    axes = [te.reduce_axis((0, int(d)), name=f"{name}_k{i}")
            for i, d in enumerate(q.shape) if i != 1]
    n = 1
    for i, d in enumerate(q.shape):
        n *= int(d) if i != 1 else 1

    def at(c):
        return q[(axes[0], c, *axes[1:])].astype(I64)

    s1 = te.compute((q.shape[1],), lambda c: te.sum(at(c), axis=axes), name=name + "_s1")
    axes2 = [te.reduce_axis((0, int(d)), name=f"{name}_j{i}")
             for i, d in enumerate(q.shape) if i != 1]
    s2 = te.compute((q.shape[1],), lambda c: te.sum(
        q[(axes2[0], c, *axes2[1:])].astype(I64) * q[(axes2[0], c, *axes2[1:])].astype(I64),
        axis=axes2), name=name + "_s2")
    return n, s1, s2


def _ratio_at(a, exponent, b: int, target):
    """a 2^exponent / b at exponent `target` (int32 exponents), rounded once."""
    up = (exponent - target).astype(I64)
    return round_div(a << tirx.max(up, i64(0)), i64(b) << tirx.max(-up, i64(0)))


def _saturated(a):
    return tirx.max(tirx.min(a, i64(INT32_LIMIT)), i64(-INT32_LIMIT)).astype(I32)


def niti_batch_norm_train(q, mean, var, e, e_mean, e_var, momentum: float, acc: str):
    """(x_hat int8, r int64 [C], g int32 [C], new running mean, new running var) of int8 q
    at exponent e[0]; the running statistics int32 [C] at e_mean[0], e_var[0]."""
    n, s1, s2 = _channel_sums(q, "bn")
    v = te.compute(s1.shape, lambda c: i64(n) * s2[c] - s1[c] * s1[c], name="bn_v",
                   attrs={KEEP_STAGE: 1})
    r, g = root(v, "bn_root")

    def normalized(*i):
        c = i[1]
        centered = (i64(n) * q(*i).astype(I64) - s1[c]) << (i64(F) + g[c].astype(I64))
        return clip8(round_div(centered, r[c])).astype("int8")

    x_hat = te.compute(q.shape, normalized, name="bn_x_hat")
    m = i64(round(momentum * (1 << MOMENTUM_BITS)))

    def moved(old, batch):
        return _saturated(old.astype(I64) + _round_shift_const(
            (batch - old.astype(I64)) * m, MOMENTUM_BITS))

    new_mean = te.compute(mean.shape, lambda c: moved(
        mean[c], _ratio_at(s1[c], e[0], n, e_mean[0])), name="bn_mean")
    new_var = te.compute(var.shape, lambda c: moved(
        var[c], _ratio_at(v[c], i32(2) * e[0], n * max(n - 1, 1), e_var[0])), name="bn_var")
    return [x_hat, r, g, new_mean, new_var]


def _round_shift_const(a, s: int):
    """RoundShift of int64 a by a constant s > 0: half away from zero."""
    neg, mag = _sign_mag(a)
    return _signed(neg, (mag + i64(1 << (s - 1))) >> i64(s))


def niti_batch_norm_backward(d_hat, x_hat, r, g, acc: str):
    """dx as int32 (at exponent e_hat - 2F - e_x) from x_hat's error d_hat (int8), x_hat
    and the forward's (r, g)."""
    n = 1
    for i, d in enumerate(d_hat.shape):
        n *= int(d) if i != 1 else 1
    axes = [te.reduce_axis((0, int(d)), name=f"bnb_k{i}")
            for i, d in enumerate(d_hat.shape) if i != 1]
    m1 = te.compute((d_hat.shape[1],), lambda c: te.sum(
        d_hat[(axes[0], c, *axes[1:])].astype(I64), axis=axes), name="bnb_m1")
    axes2 = [te.reduce_axis((0, int(d)), name=f"bnb_j{i}")
             for i, d in enumerate(d_hat.shape) if i != 1]
    m2 = te.compute((d_hat.shape[1],), lambda c: te.sum(
        d_hat[(axes2[0], c, *axes2[1:])].astype(I64) * x_hat[(axes2[0], c, *axes2[1:])]
        .astype(I64), axis=axes2), name="bnb_m2")

    def dx(*i):
        c = i[1]
        t = ((i64(n) * d_hat(*i).astype(I64) - m1[c]) << i64(2 * F)) \
            - x_hat(*i).astype(I64) * m2[c]
        return _saturated(round_div(t << g[c].astype(I64), r[c]))

    return te.compute(d_hat.shape, dx, name="bnb_dx")


def niti_batch_norm_eval(q, e, mean, var, e_mean, e_var, acc: str):
    """x_hat (int8 at -F) of int8 q at e[0] with the running statistics (int32 [C] at
    e_mean[0], e_var[0]): (q - mean) over the square root of var, both at the finer of the
    two exponents."""
    common = te.compute((1,), lambda i: tirx.min(e[0], e_mean[0]), name="bne_common",
                        attrs={KEEP_STAGE: 1})
    k = te.compute((1,), lambda i: e_var[0] - i32(2) * common[0], name="bne_k",
                   attrs={KEEP_STAGE: 1})
    units = te.compute(var.shape, lambda c: tirx.max(_round_shift_var(
        var[c].astype(I64), k[0]), i64(0)), name="bne_var", attrs={KEEP_STAGE: 1})
    r, g = root(units, "bne_root")

    def normalized(*i):
        c = i[1]
        d = (q(*i).astype(I64) << (e[0] - common[0]).astype(I64)) \
            - (mean[c].astype(I64) << (e_mean[0] - common[0]).astype(I64))
        return clip8(round_div(d << (i64(F) + g[c].astype(I64)), r[c])).astype("int8")

    return te.compute(q.shape, normalized, name="bne_x_hat")


def _round_shift_var(a, k):
    """a 2^k at integer exponent 0: a left shift for k >= 0, else RoundShift by -k."""
    neg, mag = _sign_mag(a)
    s = (-k).astype(I64)
    down = _signed(neg, (mag + (i64(1) << tirx.max(s - i64(1), i64(0)))) >> tirx.max(s, i64(0)))
    return tirx.Select(k >= i32(0), a << tirx.max(k.astype(I64), i64(0)), down)


BATCH_NORM_KERNELS = {f.__name__: f for f in (
    niti_batch_norm_train, niti_batch_norm_backward, niti_batch_norm_eval)}
