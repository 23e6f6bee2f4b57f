"""The float edge catalogue: (p, q) pairs whose probability ratios leave float64's (or float32's) range.

``p/q`` overflowed to inf for a subnormal q, and ``inf * 0`` then gave NaN in the branching law of naive,
SpecInfer, SpecTr and Khisti. Each pair is a valid probability vector in the given dtype (its
sum rounds to 1); the tests hand the same arrays to the reference (tests/ref/test_float_edges.py) and to
the engine's kernels (tests/fast/test_kernels_float_edges.py).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Pair = tuple[npt.NDArray[np.floating], npt.NDArray[np.floating]]


def edge_pairs(dtype: type[np.floating] = np.float64) -> dict[str, Pair]:
    """Name -> (p, q) as ``dtype`` arrays over three tokens; token 0 carries the edge."""
    info = np.finfo(dtype)
    sub = dtype(info.smallest_subnormal)
    normal = dtype(info.smallest_normal)
    tiny_ratio = dtype(1e-300) if dtype == np.float64 else dtype(1e-38)

    def pair(p: list[float], q: list[float]) -> Pair:
        return np.array(p, dtype=dtype), np.array(q, dtype=dtype)

    half = dtype(0.5)
    return {
        # the case of the issue: q(x) subnormal next to p(x) = 0.5, so p/q overflows
        "subnormal q next to p=0.5": pair([0.5, 0.25, 0.25], [sub, half, half - sub]),
        "subnormal q, p=0.6": pair([0.6, 0.2, 0.2], [sub, half, half - sub]),
        "subnormal p next to q=0.6": pair([sub, half, half - sub], [0.6, 0.2, 0.2]),
        "smallest normal q": pair([0.25, 0.5, 0.25], [normal, half, half - normal]),
        "ratio beyond 1e300": pair([0.5, 0.5 - tiny_ratio, tiny_ratio], [tiny_ratio, 0.5, 0.5 - tiny_ratio]),
        "subnormal q in every slot but one": pair([0.5, 0.25, 0.25], [sub, sub, 1.0]),
    }
