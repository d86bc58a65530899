"""Recognise a tagged PrimFunc (tagging.py) as a micro-kernel family and its parameters.

Each matcher takes the `ub_op` record and returns (family, parameters) or None; None keeps
the scalar kernel. The parameters are what the family's template needs: shapes, stride,
dilation and padding (in the terms of the forward conv for all three conv kernels), the
variant (direct, packed, pointwise: see templates/common/conv2d.c.j2) and the scratch layout.
"""

from __future__ import annotations

import math

import numpy as np

PACK_BYTES = 16 * 1024  # the packed operand of one block of rows stays under this
DIRECT_BYTES = 256 * 1024  # a padded image larger than this is packed in blocks instead
# The columns of a col2im block: more than PACK_BYTES, as GEMMs over few dy rows leave vector
# lanes empty and repeat their set-up. LeNet-5's second conv at batch 32: 16 KB (2 rows of
# 10 columns a GEMM) 2.20 ms a step, 32 KB (5 rows) 1.98 ms, 64 KB (all 10) 1.90 ms; its arena
# grows by the scratch: 18 KB (3%) at 32 KB, 48 KB at 64 KB.
COLS_BYTES = 32 * 1024


# BatchNorm planes (H * W) shorter than this keep the printed kernel: the micro-kernel sums
# along a plane in vectors of up to 8 lanes (BatchNorm1d over [N, C] has planes of one).
MIN_BN_PLANE = 8


# The weight gradient of a 1x1 conv is a GEMM with the smaller of O and C along the vector
# lanes (two vectors of eight) where both are at least this, else gemm_nt along HW.
# mobilenetv2_small b32 on AVX2: O=64, C=16 65 us against 87; O=16, C=64 63 us against 95;
# O=32, C=8 100 against 110 but O=8, C=8 49 against 33.
POINTWISE_LANES = 16


def _floats(info) -> bool:
    return all(d == "float32" for d in info["dtypes"])


# The data gradient of a stride-1 conv goes the col2im way (a GEMM of H * W columns and a
# scatter-add) once the direct way's windows over the zero-framed dy outnumber dy's pixels by
# this much; the scatter-add costs about one tap in O (the output channels) of the GEMM.
ZERO_FRAME_LIMIT = 1.5

# Output columns whose sums a single-row direct conv (depthwise, or one channel of A) keeps in
# registers over all taps: four NEON / SSE vectors, 16 of the 32 single registers of a
# Cortex-M FPU.
DIRECT_RUN = 16


def _align(n: int) -> int:
    return (n + 15) // 16 * 16


def _rows(per_row_elements: int, total_rows: int, budget: int = PACK_BYTES) -> int:
    return max(1, min(total_rows, budget // (4 * max(per_row_elements, 1))))


def _fills_lanes(cols: int) -> bool:
    """Whether rows of `cols` outputs waste at most 1/8 of the GEMM's vector lanes, counted in
    vectors of eight (AVX2; two of NEON): 28 does (32 lanes), 10 does not (16 lanes)."""
    return -cols % 8 * 8 <= cols + -cols % 8


def _variant(p: dict, direct_ok: bool, Hp: int, Wp: int, top: int, left: int) -> dict:
    """Direct where `direct_ok`, the padded image is small enough and one output row fills
    the vector lanes; else packed, where a block of rows fills them (LeNet-5's second conv
    forward, rows of 10, is 7% of its b32 step faster packed). The scratch layout of either
    (the bwd_data flipped weights, or a pointwise weight gradient's dw^T, last)."""
    K, pre = p["K"], 0
    packed_bytes = _align(4 * p["rows"] * p["packed_cols"] * K)
    out_bytes = 4 * p["N"] * p["O"] * p["packed_cols"] * p.get("OH", p.get("H_out"))
    # Thin rows go packed only where the packed block is small next to the output, so that
    # it hardly ever sets the arena's peak (digits_cnn at batch 1: 47,888 B, 50,912 packed).
    # One output channel keeps its direct runs; the weight gradient's NT GEMM sums along the
    # rows anyway.
    thin = p["O"] > 1 and p["mode"] != "bwd_weight" and not _fills_lanes(p["packed_cols"]) \
        and 4 * packed_bytes <= out_bytes
    if p["pointwise"]:
        p["variant"] = "pointwise"
        if p["mode"] == "bwd_weight":  # the smaller operand transposed (then dw^T, below)
            pre = _align(4 * min(p["O"], p["C"]) * p["H"] * p["W"])
    elif direct_ok and not thin and p["C"] * Hp * Wp * 4 <= DIRECT_BYTES and top >= 0 \
            and left >= 0:
        sh, sw = p["sh"], p["sw"]
        Hq, Wq = -(-Hp // sh), -(-Wp // sw)  # the phase planes (the padded image at stride 1)
        # boff in scratch at stride 1, a static table of phase offsets when strided
        boff_bytes = _align(4 * K) if sh * sw == 1 else 0
        p.update(variant="direct", Hp=Hp, Wp=Wp, Hq=Hq, Wq=Wq, top=top, left=left,
                 image_offset=boff_bytes, tile=DIRECT_RUN)
        if sh * sw > 1:
            p["phase_offsets"] = _phase_offsets(p)
        pre = boff_bytes + _align(4 * p["C"] * sh * sw * Hq * Wq)
    else:
        p["variant"] = "packed"
        pre = packed_bytes
    # after it: the bwd_data flipped weights, or a pointwise weight gradient's dw^T (O < C)
    wt = p["mode"] == "bwd_data" or (p["mode"] == "bwd_weight" and p["variant"] == "pointwise"
                                     and p["O"] < p["C"])
    p["wt_offset"] = pre
    p["scratch_bytes"] = pre + (_align(4 * p["O"] * K) if wt else 0)
    return p


def _phase_offsets(p: dict) -> list[int]:
    """Where tap (c, kh, kw) of output (0, 0) lies in the phase planes [C, sh, sw, Hq, Wq]:
    padded row kh * dh is row (kh * dh) // sh of phase (kh * dh) % sh, and so for columns."""
    sh, sw, Hq, Wq = p["sh"], p["sw"], p["Hq"], p["Wq"]
    return [(((c * sh + kh * p["dh"] % sh) * sw + kw * p["dw"] % sw) * Hq + kh * p["dh"] // sh)
            * Wq + kw * p["dw"] // sw
            for c in range(p["C"]) for kh in range(p["KH"]) for kw in range(p["KW"])]


def _pointwise(KH, KW, sh, sw, padding) -> bool:
    """A 1x1 conv of stride 1 without padding reads its operand unpacked."""
    return (KH, KW, sh, sw) == (1, 1, 1, 1) and not any(padding)


def match_depthwise(info: dict, out_shape: list[int]):
    """A depthwise conv (one filter per channel) or one of its gradients over a padded plane,
    split into stride phases when strided (the weight gradient through the GEMM core); the
    data gradient of a strided conv, and planes that do not fit, as direct loops."""
    a = info["attrs"]
    layouts = (a["data_layout"], a["kernel_layout"], a["out_layout"])
    pt, pl, pb, pr = a["padding"]
    g = a["groups"]
    if info["op"] == "relax.nn.conv2d" and layouts == ("NCHW", "OIHW", "NCHW"):
        (N, C, H, W), (w0, w1, KH, KW) = info["shapes"]
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        _, _, OH, OW = out_shape
        mode, ok = "forward", (C, w0, w1) == (g, g, 1)
        top, left = pt, pl
    elif info["op"] == "relax.nn.conv2d_transpose" and layouts == ("NCHW", "IOHW", "NCHW"):
        (N, C, H, W), (w0, w1, KH, KW) = info["shapes"]
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        _, _, OH, OW = out_shape
        top, left = (KH - 1) * dh - pt, (KW - 1) * dw - pl
        Hp, Wp = OH + (KH - 1) * dh, OW + (KW - 1) * dw
        mode = "bwd_data"
        ok = (C, w0, w1) == (g, g, 1)
        frame_ok = a["output_padding"] == [0, 0] and top + H <= Hp and left + W <= Wp
    elif info["op"] == "relax.nn.conv2d" and layouts == ("CNHW", "IOHW", "CNHW"):
        (CN, one, H, W), (N, C, OH, OW) = info["shapes"]
        _, _, KH, KW = out_shape
        (dh, dw), (sh, sw) = a["strides"], a["dilation"]  # forward stride = Relax dilation
        mode, ok = "bwd_weight", (CN, one, out_shape[0], out_shape[1]) == (C * N, 1, C, 1) \
            and g == C
        top, left = pt, pl
    else:
        return None
    if not ok:
        return None
    doc = (f"depthwise conv2d {mode}: stride {sh}x{sw}, dilation {dh}x{dw}, "
           f"padding {pt},{pl},{pb},{pr}")
    # The padded plane split by phase (row mod sh, column mod sw): a strided tap reads one
    # phase plane with unit stride, so every stride shares the stride-1 loops.
    Hq = max(OH + (KH - 1) * dh // sh, (H - 1 + top) // sh + 1)
    Wq = max(OW + (KW - 1) * dw // sw, (W - 1 + left) // sw + 1)
    fits = top >= 0 and left >= 0 and sh * sw * Hq * Wq * 4 <= DIRECT_BYTES
    if (sh, sw) != (1, 1) and (mode == "bwd_data" or not fits):
        # direct loops (templates/common/depthwise_strided.c.j2)
        p = dict(mode=mode, N=N, C=C, H=H, W=W, OH=OH, OW=OW, KH=KH, KW=KW, sh=sh, sw=sw,
                 dh=dh, dw=dw, pt=pt, pl=pl, scratch_bytes=0, doc=doc, x_nchw=False)
        if mode == "bwd_data":
            p.update(_dy_frame(p))
        return "depthwise_strided", p
    if not fits or (mode == "bwd_data" and not frame_ok):
        return None
    K = KH * KW
    image = _align(4 * K)
    p = dict(mode=mode, N=N, C=C, H=H, W=W, KH=KH, KW=KW, OH=OH, OW=OW, dh=dh, dw=dw, K=K,
             sh=sh, sw=sw, Hq=Hq, Wq=Wq, top=top, left=left, image_offset=image,
             tile=DIRECT_RUN, wt_offset=image + _align(4 * sh * sw * Hq * Wq), doc=doc,
             x_nchw=False, sums_offset=None)
    p["scratch_bytes"] = p["wt_offset"] + (_align(4 * K) if mode == "bwd_data" else 0)
    return "depthwise", p


def _dy_frame(p: dict) -> dict:
    """The zero-framed dy plane of the strided depthwise data gradient: every tap's run of
    a dx phase row then reads PW whole columns of one framed row (dy row i at row i - r0,
    column j at j - c0). Phase pw of dx column ow = b*sw + pw takes tap kw from dy column
    b + q (q = (pw - u) / sw, u = kw*dw - pl); dx row oh takes tap kh from dy row
    (oh + pt - kh*dh) / sh where that divides."""
    sh, sw, OH, OW = p["sh"], p["sw"], p["OH"], p["OW"]
    PW = (OW + sw - 1) // sw
    qs = [(u % sw - u) // sw for u in (kw * p["dw"] - p["pl"] for kw in range(p["KW"]))]
    c0, c1 = min(min(qs), 0), max(PW + max(qs), p["W"])
    r0 = min((p["pt"] - (p["KH"] - 1) * p["dh"]) // sh, 0)
    r1 = max((OH - 1 + p["pt"]) // sh + 1, p["H"])
    return dict(PW=PW, r0=r0, c0=c0, Hd=r1 - r0, Wd=c1 - c0,
                scratch_bytes=_align(4 * (r1 - r0) * (c1 - c0)))


def match_conv2d(info: dict, out_shape: list[int]):
    a = info["attrs"]
    if not _floats(info) or len(info["shapes"][0]) != 4:
        return None
    if a["groups"] != 1:
        return match_depthwise(info, out_shape)
    layouts = (a["data_layout"], a["kernel_layout"], a["out_layout"])
    pt, pl, pb, pr = a["padding"]
    if layouts == ("NCHW", "OIHW", "NCHW"):
        (N, C, H, W), (OC, _, KH, KW) = info["shapes"]
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        _, _, OH, OW = out_shape
        mode = "forward"
    elif layouts == ("CNHW", "IOHW", "CNHW"):  # the weight gradient (training/Gradient)
        (N, C, H, W), (_, OC, OH, OW) = info["shapes"]
        _, _, KH, KW = out_shape
        # Relax writes dW as a conv of x by dy: its stride is the forward dilation, its
        # dilation the forward stride.
        (dh, dw), (sh, sw) = a["strides"], a["dilation"]
        mode = "bwd_weight"
    else:
        return None
    K = C * KH * KW
    # The weight gradient's GEMM puts O or C along the vector lanes: where either is under
    # POINTWISE_LANES, the NT GEMM of the direct variant sums along HW instead.
    pointwise = _pointwise(KH, KW, sh, sw, a["padding"]) and (
        mode == "forward" or min(OC, C) >= POINTWISE_LANES)
    p = dict(mode=mode, pointwise=pointwise, N=N, C=C, H=H, W=W, O=OC, KH=KH, KW=KW, OH=OH,
             OW=OW, sh=sh, sw=sw, dh=dh, dw=dw, pt=pt, pl=pl, K=K, rows=_rows(K * OW, OH),
             packed_cols=OW)
    # the padded image must hold every window of the output: rows up to OH-1 + (KH-1)*dh
    Hp, Wp = max(H + pt + pb, OH + (KH - 1) * dh), max(W + pl + pr, OW + (KW - 1) * dw)
    # strided: direct over phase planes where the taps read every phase (a 1x1 conv of
    # stride 2 reads one of four), but for one output channel (its direct runs read the
    # padded image at stride 1)
    _variant(p, (sh, sw) == (1, 1) or (OC > 1 and KH >= sh and KW >= sw), Hp, Wp, pt, pl)
    p["doc"] = (f"conv2d {mode} ({p['variant']}): stride {sh}x{sw}, dilation {dh}x{dw}, "
                f"padding {pt},{pl},{pb},{pr}")
    return "conv2d", p


def _col2im(p: dict) -> dict:
    """The data gradient of a strided conv as a GEMM into columns and a col2im (see
    templates/common/conv2d.c.j2): cols of `rows` rows of dy, then w^T [O*KH*KW, C]."""
    Kc = p["O"] * p["KH"] * p["KW"]
    p.update(variant="col2im", rows=_rows(Kc * p["W"], p["H"], COLS_BYTES))
    p["wt_offset"] = _align(4 * Kc * p["rows"] * p["W"])
    p["scratch_bytes"] = p["wt_offset"] + _align(4 * Kc * p["C"])
    p["doc"] = (f"conv2d bwd_data (col2im, a conv2d_transpose): stride {p['sh']}x{p['sw']}, "
                f"dilation {p['dh']}x{p['dw']}, padding {p['pt']},{p['pl']}")
    return p


def match_conv2d_transpose(info: dict, out_shape: list[int]):
    a = info["attrs"]
    layouts = (a["data_layout"], a["kernel_layout"], a["out_layout"])
    if not _floats(info) or layouts != ("NCHW", "IOHW", "NCHW"):
        return None
    if a["groups"] != 1:
        return match_depthwise(info, out_shape)
    (N, C, H, W), (_, OC, KH, KW) = info["shapes"]
    _, _, H_out, W_out = out_shape
    (sh, sw), (dh, dw) = a["strides"], a["dilation"]
    pt, pl, _, _ = a["padding"]
    K = C * KH * KW
    pointwise = _pointwise(KH, KW, sh, sw, a["padding"]) and (H, W) == (H_out, W_out)
    p = dict(mode="bwd_data", pointwise=pointwise, N=N, C=C, H=H, W=W, O=OC, KH=KH, KW=KW,
             H_out=H_out, W_out=W_out, sh=sh, sw=sw, dh=dh, dw=dw, pt=pt, pl=pl, K=K,
             rows=_rows(K * W_out, H_out), packed_cols=W_out)
    # dy sits in a zero frame wide enough for every flipped window of dx
    top, left = (KH - 1) * dh - pt, (KW - 1) * dw - pl
    Hp, Wp = H_out + (KH - 1) * dh, W_out + (KW - 1) * dw
    fits = top + H <= Hp and left + W <= Wp
    # The direct correlation multiplies every tap of the zero frame too: H_out * W_out windows
    # where the GEMM into columns takes H * W (a 5x5 valid conv of 14x14: 196 against 100).
    frame_heavy = H_out * W_out > ZERO_FRAME_LIMIT * H * W
    if ((sh, sw) != (1, 1) or frame_heavy) and not pointwise:
        return "conv2d", _col2im(p)
    _variant(p, (sh, sw) == (1, 1) and fits, Hp, Wp, top, left)
    p["doc"] = (f"conv2d bwd_data ({p['variant']}, a conv2d_transpose): stride {sh}x{sw}, "
                f"dilation {dh}x{dw}, padding {pt},{pl}")
    return "conv2d", p


def match_matmul(info: dict, out_shape: list[int]):
    shapes = info["shapes"]
    if not _floats(info) or len(shapes[0]) != 2 or len(shapes[1]) != 2:
        return None
    if info["attrs"].get("transpose_b"):  # a [M, K] . b [N, K]^T: the A . B^T GEMM
        (M, K), (N, _) = shapes
        return "matmul", dict(M=M, N=N, K=K, mode="nt", scratch_bytes=_align(4 * N))
    (M, K), (_, N) = shapes
    return "matmul", dict(M=M, N=N, K=K, scratch_bytes=0)


def match_max_pool2d_backward(info: dict, out_shape: list[int]):
    """Every max_pool2d gradient of float32 NCHW tensors (the template is plain C)."""
    if not _floats(info):
        return None
    a = info["attrs"]
    (N, C, OH, OW), (_, _, H, W) = info["shapes"]
    (KH, KW), (SH, SW), (DH, DW) = a["pool_size"], a["strides"], a["dilation"]
    PT, PL = a["padding"][:2]
    inside = PL == 0 and (OW - 1) * SW + (KW - 1) * DW < W  # no tap leaves a row sideways
    return "max_pool2d_backward", dict(N=N, C=C, H=H, W=W, OH=OH, OW=OW, KH=KH, KW=KW, SH=SH,
                                       SW=SW, PT=PT, PL=PL, DH=DH, DW=DW, inside=inside,
                                       relu=False, scratch_bytes=0)


def match_batch_norm(info: dict, out_shape: list[int]):
    """BatchNorm's statistics and its backward (lowering/batch_norm_kernels.py) over float32
    x [N, C, ...]: in vector lanes along each of the N * C planes (their order and scratch:
    render.py's _lane_order), so a plane shorter than a vector of lanes keeps the printed
    kernel."""
    if not _floats(info):
        return None
    N, C, *plane = info["shapes"][0]
    HW = math.prod(plane)
    if HW < MIN_BN_PLANE:
        return None
    a = info["attrs"]
    mode = "stats" if info["op"] == "batch_norm_stats" else "backward"
    # dx may be written over x (in place): the template reads x before it writes dx
    params = dict(mode=mode, N=N, C=C, HW=HW, acc=a["acc"], scratch_bytes=0,
                  alias_safe=mode == "backward", mask=None)
    if mode == "stats":  # the constants of the TE kernel, rounded as it rounds them
        m, count = a["momentum"], N * HW
        params.update(momentum=c_float(m, "float32"), keep=c_float(1.0 - m, "float32"),
                      unbiased=c_float(m * count / (count - 1), "float32"),
                      eps=c_float(a["eps"], a["acc"]))
    return "batch_norm", params


def c_float(value: float, dtype: str) -> str:
    """`value` rounded to `dtype`, as an exact C literal (hexadecimal)."""
    if dtype == "float64":
        return float(value).hex()
    return float(np.float32(value)).hex() + "f"


MATCHERS = {"relax.nn.conv2d": match_conv2d,
            "relax.nn.conv2d_transpose": match_conv2d_transpose,
            "relax.matmul": match_matmul,
            "relax.grad.max_pool2d_backward": match_max_pool2d_backward,
            "batch_norm_stats": match_batch_norm,
            "batch_norm_train_backward": match_batch_norm}


def match(info: dict, out_shape: list[int]):
    matcher = MATCHERS.get(info["op"])
    return matcher(info, out_shape) if matcher else None
