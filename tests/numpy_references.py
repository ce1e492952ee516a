"""Independent NumPy references for the convolution and pooling tests (functional and module):
loops over output (or input) positions on tiny shapes, float64 throughout.

(Imported by name; pytest puts the tests folder on ``sys.path`` for its conftest.)
"""

from __future__ import annotations

import numpy as np


def ref_conv2d(x, w, b=None, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                r, s = i * stride[0], j * stride[1]
                patch = xp[:, g * cg : (g + 1) * cg, r : r + dil[0] * (kh - 1) + 1 : dil[0],
                           s : s + dil[1] * (kw - 1) + 1 : dil[1]]
                out[:, oc, i, j] = (patch * w[oc]).sum(axis=(1, 2, 3))
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def ref_conv_transpose2d(x, w, stride, pad, out_pad, dil, groups):
    n, cin, h, wd = x.shape
    _, og, kh, kw = w.shape
    oh = (h - 1) * stride[0] - 2 * pad[0] + dil[0] * (kh - 1) + out_pad[0] + 1
    ow = (wd - 1) * stride[1] - 2 * pad[1] + dil[1] * (kw - 1) + out_pad[1] + 1
    buf = np.zeros((n, og * groups, oh + 2 * pad[0], ow + 2 * pad[1]))
    cg = cin // groups
    for ic in range(cin):
        g = ic // cg
        for i in range(h):
            for j in range(wd):
                for a in range(kh):
                    for bb in range(kw):
                        r, s = i * stride[0] + a * dil[0], j * stride[1] + bb * dil[1]
                        contrib = x[:, ic, i, j, None] * w[ic, :, a, bb]
                        buf[:, g * og : (g + 1) * og, r, s] += contrib
    return buf[:, :, pad[0] : pad[0] + oh, pad[1] : pad[1] + ow]


def ref_pool(x, k, s, p, kind, include_pad=False):
    """Max or average pooling; ``k``, ``s``, ``p`` are ints or (h, w) pairs."""
    k, s, p = (v if isinstance(v, tuple) else (v, v) for v in (k, s, p))
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p[0] - k[0]) // s[0] + 1, (w + 2 * p[1] - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s[0] - p[0], j * s[1] - p[1]
            rs, cs = max(r0, 0), max(c0, 0)
            re, ce = min(r0 + k[0], h), min(c0 + k[1], w)
            win = x[:, :, rs:re, cs:ce]
            if kind == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                denom = k[0] * k[1] if include_pad else (re - rs) * (ce - cs)
                out[:, :, i, j] = win.sum(axis=(2, 3)) / denom
    return out
