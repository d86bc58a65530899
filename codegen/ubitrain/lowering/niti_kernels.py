"""TE kernels of NITI's integer ops (ops/niti.py): the plain-C reference of every int8 step.

They compute niti/rounding.py's rules (RoundShift, PstoShift, bit lengths), niti/rescale.py's
shift of a site (exact, counted, adaptive) and niti/quantize.py's float-to-int8 rule on
integers only, in int64 where a shift could overflow int32; the numpy reference computes the
same, so the generated C must equal it bit for bit.
"""

from __future__ import annotations

import functools
import itertools

from tvm import te, tirx

from ..niti.align import ALIGN_BITS, BIAS_BITS
from ..niti.loss import ERROR_SHIFT, GRAD_FRACTION_BITS, LOG2E_Q15, TOP_EXPONENT
from ..niti.micro_batches import SHIFT_LIMIT
from ..niti.rescale import ADAPTIVE, COUNTDOWN, EXACT, EXPONENT, INTERVAL, REDUCTIONS, SHIFT, SKIPS
from ..niti.rounding import LOWEST_BOUND_EXPONENT
from ..niti.tables import E_HI, E_LO
from ..niti.update import BIAS_MU_OFFSET
from .tir_lower import KEEP_STAGE

I32, I64 = "int32", "int64"
INT8_MAX = 127
BITLEN_BITS = 48  # an int64 bit length is counted over these bits


def i64(v) -> tirx.PrimExpr:
    return tirx.const(v, I64)


def i32(v) -> tirx.PrimExpr:
    return tirx.const(v, I32)


def _sign_mag(a):
    """(sign, magnitude) of an int64 expression."""
    neg = a < i64(0)
    return neg, tirx.Select(neg, -a, a)


def _signed(neg, mag):
    return tirx.Select(neg, -mag, mag)


def round_shift(a, s):
    """RoundShift of int64 `a` by int32 `s`: half away from zero; s <= 0 shifts left."""
    neg, mag = _sign_mag(a)
    s64 = s.astype(I64)
    right = (mag + (i64(1) << tirx.max(s64 - i64(1), i64(0)))) >> tirx.max(s64, i64(0))
    return tirx.Select(s > i32(0), _signed(neg, right), a << tirx.max(-s64, i64(0)))


def psto_shift(a, s):
    """PstoShift of int64 `a` by int32 `s`: away from zero when the high half of the dropped
    bits beats the low half (doubled when s is odd); s <= 0 shifts left."""
    neg, mag = _sign_mag(a)
    s64 = tirx.max(s.astype(I64), i64(0))
    low = s64 >> i64(1)
    rest = mag & ((i64(1) << s64) - i64(1))
    probability = rest >> low
    noise = (rest & ((i64(1) << low) - i64(1))) << (s64 & i64(1))
    up = (mag >> s64) + tirx.Select(probability > noise, i64(1), i64(0))
    return tirx.Select(s > i32(0), _signed(neg, up), a << tirx.max(-s.astype(I64), i64(0)))


def clip8(a):
    return tirx.max(tirx.min(a, i64(INT8_MAX)), i64(-INT8_MAX))


def _axes(t, name):
    return [te.reduce_axis((0, int(d)), name=f"{name}{i}") for i, d in enumerate(t.shape)]


def max_abs(t, name: str):
    """max |t| over every element, int64, as a 0-d tensor."""
    axes = _axes(t, name)
    return te.compute((), lambda: te.max(_sign_mag(t[tuple(axes)].astype(I64))[1], axis=axes),
                      name=name)


def bitlen(m, name: str):
    """Bits of the non-negative int64 0-d tensor `m` (0 for 0), as an int32 0-d tensor."""
    k = te.reduce_axis((0, BITLEN_BITS), name=name + "_k")
    return te.compute((), lambda: te.sum(tirx.Select(
        (m() >> k.astype(I64)) > i64(0), i32(1), i32(0)), axis=k), name=name)


def exponent_sum(parts, name: str):
    return te.compute((1,), lambda i: sum((p[0] for p in parts[1:]), parts[0][0]), name=name)


class Shift:
    """The shift of an int32 (or wider) tensor at a site, by niti/rescale.py's rule: stages
    for the exact shift, whether a prediction holds, and the site's new fields. Without a
    site (predict) the shift is the exact one."""

    def __init__(self, t, site, bits: int, mode: int, max_interval: int, name: str):
        self.site, self.name = site, name
        self.max = max_abs(t, name + "_max")
        length = bitlen(self.max, name + "_bits")
        self.exact = te.compute((), lambda: tirx.max(length() - i32(bits), i32(0)),
                                name=name + "_exact")
        if site is None or mode == EXACT:
            self.value = self.exact
            return
        adaptive = mode == ADAPTIVE

        def predicted():  # an adaptive site with a shift it may reuse this time
            if not adaptive:
                return tirx.const(False, "bool")
            return tirx.all(site[INTERVAL] > i32(0), site[COUNTDOWN] > i32(0))

        def holds():  # ... and no magnitude reaches 2^(shift + bits): one reduction skipped
            limit = i64(1) << (site[SHIFT].astype(I64) + i64(bits))
            return tirx.all(predicted(), self.max() < limit)

        self.skipped = te.compute((), lambda: tirx.Select(holds(), i32(1), i32(0)),
                                  name=name + "_skipped")
        self.value = te.compute((), lambda: tirx.Select(
            self.skipped() > i32(0), site[SHIFT], self.exact()), name=name + "_shift")

        def interval():
            same = tirx.all(site[INTERVAL] > i32(0), self.exact() == site[SHIFT])
            learned = tirx.Select(same, tirx.min(i32(2) * site[INTERVAL], i32(max_interval)),
                                  i32(1))
            return tirx.Select(predicted(), i32(1), learned)  # saturated: start again

        self.interval = te.compute((), interval, name=name + "_interval")

    def new_site(self, exponent):
        """The site's fields after this shift (each reads its own old field only)."""
        site, skipped = self.site, self.skipped

        def field(f):
            reduced = tirx.Select(f == i32(SHIFT), self.exact(), tirx.Select(
                tirx.any(f == i32(INTERVAL), f == i32(COUNTDOWN)), self.interval(),
                tirx.Select(f == i32(REDUCTIONS), site[f] + i32(1), site[f])))
            kept = tirx.Select(f == i32(COUNTDOWN), site[f] - i32(1), tirx.Select(
                f == i32(SKIPS), site[f] + i32(1), site[f]))
            value = tirx.Select(skipped() > i32(0), kept, reduced)
            return tirx.Select(f == i32(EXPONENT), exponent[0], value)

        return te.compute(site.shape, lambda f: field(f.astype(I32)), name=self.name + "_site")


def _narrowed(total, shift, name):
    return te.compute(total.shape, lambda *i: clip8(round_shift(
        total(*i).astype(I64), shift.value())).astype("int8"), name=name)


def niti_rescale(total, *rest, mode: int, max_interval: int, acc: str):
    """(int8, exponent, new site) of an int32 accumulator whose exponent is the sum of the
    exponent tensors before the site in `rest`."""
    parts, site = rest[:-1], rest[-1]
    shift = Shift(total, site, 7, mode, max_interval, "rescale")
    e_in = exponent_sum(parts, "rescale_e_in")
    e = te.compute((1,), lambda i: e_in[0] + shift.value(), name="rescale_e")
    return [_narrowed(total, shift, "rescale_q"), e, shift.new_site(e)]


def niti_rescale_exact(total, *parts, acc: str):
    """(int8, exponent) with the exact shift, no site (predict)."""
    shift = Shift(total, None, 7, EXACT, 1, "narrow")
    e_in = exponent_sum(parts, "narrow_e_in")
    e = te.compute((1,), lambda i: e_in[0] + shift.value(), name="narrow_e")
    return [_narrowed(total, shift, "narrow_q"), e]


def niti_align_add(a, ea, b, eb, acc: str):
    """(a 2^ea + b 2^eb as int32, its exponent): the operand of the larger exponent shifted
    left by the difference, at most ALIGN_BITS, the other RoundShift'ed by the rest."""
    d = te.compute((), lambda: ea[0] - eb[0], name="align_d")
    left = te.compute((), lambda: tirx.min(tirx.Select(d() < i32(0), -d(), d()), i32(ALIGN_BITS)),
                      name="align_left")

    def total(*i):
        x, y = a(*i).astype(I64), b(*i).astype(I64)
        big, small = tirx.Select(d() >= i32(0), x, y), tirx.Select(d() >= i32(0), y, x)
        gap = tirx.Select(d() < i32(0), -d(), d())
        return ((big << left().astype(I64)) + round_shift(small, gap - left())).astype(I32)

    out = te.compute(a.shape, total, name="align_sum")
    e = te.compute((1,), lambda i: tirx.max(ea[0], eb[0]) - left(), name="align_e")
    return [out, e]


def niti_align_concat(*rest, axis: int, acc: str):
    """int8 parts (the first half of `rest`; their exponents the second) joined along `axis`
    at the exponent max(max e - ALIGN_BITS, min e), each RoundShift'ed to it."""
    n = len(rest) // 2
    parts, exps = rest[:n], rest[n:]
    common = te.compute((1,), lambda i: tirx.max(
        functools.reduce(tirx.max, [e[0] for e in exps]) - i32(ALIGN_BITS),
        functools.reduce(tirx.min, [e[0] for e in exps])), name="concat_e")
    offsets = list(itertools.accumulate([int(p.shape[axis]) for p in parts], initial=0))
    shape = list(parts[0].shape)
    shape[axis] = offsets[-1]

    def joined(*i):
        value = None
        for k in reversed(range(n)):  # the last part's test first, then each earlier one
            j = list(i)
            j[axis] = i[axis] - offsets[k]
            part = round_shift(parts[k](*j).astype(I64), common[0] - exps[k][0]).astype(I32)
            value = part if value is None else tirx.if_then_else(  # lazy: no read beyond
                i[axis] >= offsets[k + 1], value, part)  # the part's own range
        return value

    return [te.compute(shape, joined, name="concat_aligned"), common]


def niti_align_bias(total, *rest, acc: str):
    """(total + bias, how many bits coarser the sum is than total): total int32, channels on
    dimension 1, its exponent the sum of the exponent tensors in `rest` before the bias; the
    bias int32 [C] at its exponent (niti/align.py align_bias)."""
    parts, bias, eb = rest[:-2], rest[-2], rest[-1]
    e_total = exponent_sum(parts, "bias_e_total")
    gap = te.compute((), lambda: eb[0] - e_total[0], name="bias_gap")  # > 0: bias coarser
    room = bitlen(max_abs(bias, "bias_max"), "bias_bits")
    left = te.compute((), lambda: tirx.max(tirx.min(gap(), i32(BIAS_BITS) - room()), i32(0)),
                      name="bias_left", attrs={KEEP_STAGE: 1})
    coarser = te.compute((1,), lambda i: tirx.max(gap() - left(), i32(0)), name="bias_coarser")

    def added(*i):
        b = bias[i[1]].astype(I64)
        aligned = tirx.Select(gap() >= i32(0), b << left().astype(I64), round_shift(b, -gap()))
        return (round_shift(total(*i).astype(I64), coarser[0]) + aligned).astype(I32)

    return [te.compute(total.shape, added, name="bias_add"), coarser]


def niti_quantize(x, acc: str):
    """(int8, exponent) of a float32 tensor from the bits of its floats (niti/quantize.py):
    e = bitlen(M_max) + b_max - 7 for the largest magnitude M_max 2^b_max, each element
    RoundShift(M, e - b) clipped; an all-zero tensor gets exponent 0."""
    bits = te.compute(x.shape, lambda *i: tirx.reinterpret("uint32", x(*i)).astype(I64)
                      & i64(0x7FFFFFFF), name="quant_bits")
    axes = _axes(x, "quant_k")
    top = te.compute((), lambda: te.max(bits[tuple(axes)], axis=axes), name="quant_top")

    def mantissa(b):
        field = b >> i64(23)
        return (b & i64(0x7FFFFF)) | tirx.Select(field > i64(0), i64(1 << 23), i64(0))

    def base(b):
        return tirx.max(b >> i64(23), i64(1)) - i64(150)

    top_mant = te.compute((), lambda: mantissa(top()), name="quant_top_mant")
    e = te.compute((1,), lambda i: tirx.Select(
        top() == i64(0), i32(0),
        (bitlen(top_mant, "quant_bitlen")().astype(I64) + base(top()) - i64(7)).astype(I32)),
        name="quant_e")

    def element(*i):
        b = bits(*i)
        shift = tirx.min(e[0].astype(I64) - base(b), i64(40)).astype(I32)
        mag = clip8(round_shift(mantissa(b), shift))
        negative = tirx.reinterpret("uint32", x(*i)) >> tirx.const(31, "uint32")
        return tirx.Select(negative > tirx.const(0, "uint32"), -mag, mag).astype("int8")

    return [te.compute(x.shape, element, name="quant_q"), e]


def pow2f(e):
    """2^e as a float32, exactly, for e in [-149, 127], from its bits."""
    normal = ((e + i32(127)).astype("uint32") << tirx.const(23, "uint32"))
    tiny = tirx.const(1, "uint32") << (e + i32(149)).astype("uint32")
    return tirx.reinterpret("float32", tirx.Select(e >= i32(-126), normal, tiny))


def niti_int8_bound(e, value: int, acc: str):
    """niti/rounding.py int8_bound: RoundShift(value, e) clipped, e at least -16."""
    return te.compute((1,), lambda i: clip8(round_shift(
        i64(value), tirx.max(e[0], i32(LOWEST_BOUND_EXPONENT)))).astype("int8"), name="bound")


def niti_dequantize(q, e, acc: str):
    return te.compute(q.shape, lambda *i: q(*i).astype("float32") * pow2f(e[0]),
                      name="dequant")


def niti_softmax_xent(logits, e, labels, acc: str):
    """(int8 error, exponent 0; the mean cross-entropy of the dequantized logits): niti/loss.py."""
    batch, classes = (int(d) for d in logits.shape)
    t = te.compute(logits.shape, lambda b, k: logits[b, k].astype(I64) * i64(LOG2E_Q15),
                   name="xent_t")
    km = te.reduce_axis((0, classes), name="xent_km")
    tmax = te.compute((batch,), lambda b: te.max(t[b, km], axis=km), name="xent_tmax")
    k15 = te.compute((), lambda: i32(15) - e[0], name="xent_k15")

    def drop(b, k):  # how many halvings below the row's maximum
        d = tmax[b] - t[b, k]
        near = d >> tirx.max(k15(), i32(0)).astype(I64)
        far = tirx.Select(d == i64(0), i64(0), tirx.min(
            d << tirx.min(-k15(), i32(4)).astype(I64), i64(TOP_EXPONENT + 1)))
        return tirx.Select(k15() >= i32(0), near, far)

    def power(b, k):
        s = i64(TOP_EXPONENT) - tirx.min(q[b, k], i64(TOP_EXPONENT + 1))
        return tirx.Select(s > i64(0), (i64(1) << tirx.max(s, i64(0))) - i64(1), i64(0))

    # each step a stage of its own (KEEP_STAGE): nested, TVM's simplifier takes minutes
    q = te.compute(logits.shape, drop, name="xent_q", attrs={KEEP_STAGE: 1})
    p = te.compute(logits.shape, power, name="xent_p", attrs={KEEP_STAGE: 1})
    ks = te.reduce_axis((0, classes), name="xent_ks")
    total = te.compute((batch,), lambda b: te.sum(p[b, ks], axis=ks), name="xent_total")

    def gradient(b, k):  # (p - onehot total) 2^11 / total, truncated toward zero
        v = p[b, k] - tirx.Select(labels[b].astype(I32) == k.astype(I32), total[b], i64(0))
        neg, mag = _sign_mag(v << i64(GRAD_FRACTION_BITS))
        return _signed(neg, tirx.truncdiv(mag, total[b]))

    g = te.compute(logits.shape, gradient, name="xent_g", attrs={KEEP_STAGE: 1})
    err = te.compute(logits.shape, lambda b, k: clip8(psto_shift(g[b, k], i32(ERROR_SHIFT)))
                     .astype("int8"), name="xent_err")
    # the loss, in the accumulator type: log sum exp of the dequantized logits
    scale = te.compute((), lambda: pow2f(e[0]).astype(acc), name="xent_scale")
    kz = te.reduce_axis((0, classes), name="xent_kz")
    zmax = te.compute((batch,), lambda b: te.max(logits[b, kz], axis=kz), name="xent_zmax")
    ke = te.reduce_axis((0, classes), name="xent_ke")
    sums = te.compute((batch,), lambda b: te.sum(tirx.exp(
        (logits[b, ke].astype(acc) - zmax[b].astype(acc)) * scale()), axis=ke), name="xent_sum")
    kb = te.reduce_axis((0, batch), name="xent_kb")
    summed = te.compute((), lambda: te.sum(tirx.log(sums[kb]) - (
        logits[kb, labels[kb]].astype(acc) - zmax[kb].astype(acc)) * scale(), axis=kb),
        name="xent_summed")
    loss = te.compute((), lambda: (summed() / tirx.const(batch, acc)).astype("float32"),
                      name="xent_loss")
    return [err, loss]


def _coarsest(e, name: str):
    k = te.reduce_axis((0, int(e.shape[0])), name=name + "_k")
    return te.compute((1,), lambda i: te.max(e[k], axis=k), name=name)


def niti_to_coarsest(total, e, axis: int, acc: str, start: int = 0):
    """niti/channel_exponents.py to_coarsest: channel c (along `axis`) of an int32
    accumulator RoundShift'ed by max(e) - e[start + c] (never wider: it stays int32); (the
    total, the coarsest exponent (1,)). `start` > 0: a product by the weight's rows from
    `start` on, `e` the whole weight's (ops/niti.py)."""
    top = _coarsest(e, "coarsest")
    out = te.compute(total.shape, lambda *i: round_shift(
        total(*i).astype(I64), top[0] - e[_channel(i[axis], start)]).astype(I32),
        name="to_coarsest")
    return [out, top]


def niti_weight_at_coarsest(q, e, acc: str, start: int = 0):
    """An int8 weight with an exponent per output channel (axis 0) at the coarsest one, for
    the backward: (int8 values, the coarsest exponent (1,)); `start` as niti_to_coarsest's."""
    top = _coarsest(e, "weight_coarsest")
    out = te.compute(q.shape, lambda *i: clip8(round_shift(
        q(*i).astype(I64), top[0] - e[_channel(i[0], start)])).astype("int8"),
        name="weight_at_coarsest")
    return [out, top]


def _channel(c, start: int):
    """The whole weight's channel of a part's channel c (no `+ 0`: a whole weight's kernels
    print as before)."""
    return c + start if start else c


def _finer_than_coarsest(e):
    top = _coarsest(e, "update_coarsest")
    finer = te.compute(e.shape, lambda c: top[0] - e[c], name="update_finer")
    return lambda c: finer[c]


def niti_update(param, grad, mu, exponents=None):
    """NITI's update of one parameter from its int32 gradient: g = PstoShift(G, bitlen(max|G|)
    - mu); an int8 weight becomes clip(w - clip(g)), an int32 bias b - g (with mu + 8,
    saturated to int32). `mu` is a float32 tensor of shape (1,): the step's schedule value.
    `exponents`: a weight's per channel (axis 0); channel c shifts by max - e[c] less
    (niti/channel_exponents.py update)."""
    big = max_abs(grad, "update_max")
    length = bitlen(big, "update_bits")
    weight = str(param.dtype) == "int8"
    offset = 0 if weight else BIAS_MU_OFFSET
    # its own stage even for one element: inlined into PstoShift, TVM 0.27's simplifier
    # drops the rounding term (the bias of a 1-channel conv rounded down, fuzz seed 203115)
    shift = te.compute((), lambda: tirx.max(
        length() - mu[0].astype(I32) - i32(offset), i32(0)), name="update_shift",
        attrs={KEEP_STAGE: 1})

    finer = None if exponents is None else _finer_than_coarsest(exponents)

    def rule(*i):
        g = psto_shift(grad(*i).astype(I64), shift() if finer is None else shift() - finer(i[0]))
        if weight:
            return clip8(param(*i).astype(I64) - clip8(g)).astype("int8")
        new = param(*i).astype(I64) - g
        return tirx.max(tirx.min(new, i64(2**31 - 1)), i64(-2**31 + 1)).astype(I32)

    return te.compute(param.shape, rule, name="niti_update")


def niti_accumulate(acc, e_acc, grad, e_grad):
    """One micro-batch's int32 gradient at exponent e_grad added to the running sum `acc`
    at e_acc (niti/micro_batches.py accumulate): (the sum, its exponent), each written over
    its input. Both outputs read the gap, a stage of its own, not e_acc: whichever is
    stored first, the other sees the old exponent."""
    gap = te.compute((), lambda: e_grad[0] - e_acc[0], name="acc_gap", attrs={KEEP_STAGE: 1})

    def shifted(x, s):
        return round_shift(x.astype(I64), tirx.min(tirx.max(s, i32(0)), i32(SHIFT_LIMIT)))

    total = te.compute(acc.shape, lambda *i: (shifted(acc(*i), gap())
                                              + shifted(grad(*i), -gap())).astype(I32),
                       name="acc_sum")
    e = te.compute((1,), lambda i: e_grad[0] - tirx.min(gap(), i32(0)), name="acc_e")
    return [total, e]


def _table_entry(q, e, values, exponents, name: str):
    """niti/tables.py table_index: the table row of exponent e[0] (held to the range) and,
    per element, the entry for q (RoundShift'ed down from below the range, shifted up with
    clipping from above it); (entry(*i), the row's exponent (1,))."""
    row = te.compute((), lambda: tirx.min(tirx.max(e[0] - i32(E_LO), i32(0)),
                                          i32(E_HI - E_LO)), name=name + "_row")
    below = te.compute((), lambda: tirx.max(i32(E_LO) - e[0], i32(0)), name=name + "_below")
    above = te.compute((), lambda: tirx.min(tirx.max(e[0] - i32(E_HI), i32(0)), i32(8)),
                       name=name + "_above")

    def column(*i):  # q itself in range (-128 too), else moved and clipped
        x = q(*i).astype(I64)
        moved = clip8(tirx.Select(below() > i32(0), round_shift(x, below()),
                                  x << above().astype(I64)))
        inside = tirx.all(below() == i32(0), above() == i32(0))
        return (tirx.Select(inside, x, moved) + i64(128)).astype(I32)

    exponent = te.compute((1,), lambda i: exponents[row()], name=name + "_exponent")
    return (lambda *i: values[row(), column(*i)]), exponent


def niti_table(q, e, values, exponents, acc: str):
    """An elementwise function by compile-time table (niti/tables.py): (F_e[q], exponent)."""
    entry, exponent = _table_entry(q, e, values, exponents, "table")
    return [te.compute(q.shape, entry, name="table"), exponent]


def niti_table_grad(err, q, e, values, exponents, acc: str):
    """Its backward: (err D_e[q] in int32, D_e's exponent)."""
    entry, exponent = _table_entry(q, e, values, exponents, "table_grad")
    out = te.compute(err.shape, lambda *i: err(*i).astype(I32) * entry(*i).astype(I32),
                     name="table_grad")
    return [out, exponent]


NITI_KERNELS = {f.__name__: f for f in (
    niti_rescale, niti_rescale_exact, niti_align_add, niti_align_concat, niti_align_bias,
    niti_int8_bound, niti_quantize, niti_to_coarsest, niti_weight_at_coarsest,
    niti_dequantize, niti_softmax_xent, niti_table, niti_table_grad)}
