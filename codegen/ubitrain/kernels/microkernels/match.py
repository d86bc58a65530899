"""Recognise a tagged PrimFunc (tagging.py) as a micro-kernel family and its parameters.

Each matcher takes the `ub_op` record and returns (family, parameters) or None; None keeps
the scalar kernel. The parameters are what the family's template needs: shapes, stride,
dilation and padding, in the terms of the forward conv for all three conv kernels.
"""

from __future__ import annotations

PACK_BYTES = 16 * 1024  # the packed operand of one block of rows stays under this


def _floats(info) -> bool:
    return all(d == "float32" for d in info["dtypes"])


def _rows(per_row_elements: int, total_rows: int) -> int:
    return max(1, min(total_rows, PACK_BYTES // (4 * max(per_row_elements, 1))))


def _pointwise(KH, KW, sh, sw, padding) -> bool:
    """A 1x1 conv of stride 1 without padding reads its operand unpacked."""
    return (KH, KW, sh, sw) == (1, 1, 1, 1) and not any(padding)


def match_conv2d(info: dict, out_shape: list[int]):
    a = info["attrs"]
    if not _floats(info) or a["groups"] != 1 or len(info["shapes"][0]) != 4:
        return None
    layouts = (a["data_layout"], a["kernel_layout"], a["out_layout"])
    pt, pl, _, _ = a["padding"]
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
    rows = _rows(K * OW, OH)
    pointwise = mode == "forward" and _pointwise(KH, KW, sh, sw, a["padding"])
    if pointwise:
        rows = 0  # no packed operand
    p = dict(mode=mode, pointwise=pointwise, N=N, C=C, H=H, W=W, O=OC, KH=KH, KW=KW, OH=OH,
             OW=OW, sh=sh, sw=sw, dh=dh, dw=dw, pt=pt, pl=pl, K=K, rows=rows,
             scratch_elements=rows * OW * K)
    p["doc"] = (f"conv2d {mode}: stride {sh}x{sw}, dilation {dh}x{dw}, padding {pt},{pl}; "
                f"{rows} output rows per packed block")
    return "conv2d", p


def match_conv2d_transpose(info: dict, out_shape: list[int]):
    a = info["attrs"]
    layouts = (a["data_layout"], a["kernel_layout"], a["out_layout"])
    if not _floats(info) or a["groups"] != 1 or layouts != ("NCHW", "IOHW", "NCHW"):
        return None
    (N, C, H, W), (_, OC, KH, KW) = info["shapes"]
    _, _, H_out, W_out = out_shape
    (sh, sw), (dh, dw) = a["strides"], a["dilation"]
    pt, pl, _, _ = a["padding"]
    K = C * KH * KW
    pointwise = _pointwise(KH, KW, sh, sw, a["padding"]) and (H, W) == (H_out, W_out)
    rows = 0 if pointwise else _rows(K * W_out, H_out)
    packed = rows * W_out * K
    p = dict(mode="bwd_data", pointwise=pointwise, N=N, C=C, H=H, W=W, O=OC, KH=KH, KW=KW,
             H_out=H_out, W_out=W_out, sh=sh, sw=sw, dh=dh, dw=dw, pt=pt, pl=pl, K=K, rows=rows,
             packed_elements=packed,
             scratch_elements=packed + OC * K)
    p["doc"] = (f"conv2d bwd_data (conv2d_transpose): stride {sh}x{sw}, dilation {dh}x{dw}, "
                f"padding {pt},{pl}; {rows} rows of dx per packed block")
    return "conv2d", p


def match_matmul(info: dict, out_shape: list[int]):
    shapes = info["shapes"]
    if not _floats(info) or len(shapes[0]) != 2 or len(shapes[1]) != 2:
        return None
    (M, K), (_, N) = shapes
    return "matmul", dict(M=M, N=N, K=K, scratch_elements=0)


MATCHERS = {"relax.nn.conv2d": match_conv2d,
            "relax.nn.conv2d_transpose": match_conv2d_transpose,
            "relax.matmul": match_matmul}


def match(info: dict, out_shape: list[int]):
    matcher = MATCHERS.get(info["op"])
    return matcher(info, out_shape) if matcher else None
