"""A recurrent draft head's level in one native call (``spec_fast_feature_mlp`` in ``layer.c``).

The ``rnn`` head of :mod:`spec_fast.drafts.heads` maps a token's embedding and the feature before it to the next
feature through an input projection, a residual MLP block and a norm, and scores that feature with the subset
LM head. Through torch, a one-row level cost about 2 ms of operations and product calls around some 0.3 ms of
weight reads, more than a third of a target pass; here it is one call, with the decoder layers' arithmetic
(the same norm, SiLU and products), whose head scores only the rows the caller asks for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_fast.lean import native

__all__ = ["FeatureMlpWeights", "feature_mlp"]


@dataclass(frozen=True)
class FeatureMlpWeights:
    """The head's weights as the native call reads them: the products ``fc [H, 2H]``, ``gate``/``up [I, H]``,
    ``down [H, I]`` packed as ``kind`` (``"float32"``: :func:`native.pack_float32`, else GGUF blocks), the two
    norms' weights ``[H]`` and their shared ``eps``, and the subset LM head (``head_kind``, ``head`` packed for
    ``subset`` outputs) or None."""

    hidden: int
    inter: int
    kind: str
    fc: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    mlp_norm: torch.Tensor
    norm: torch.Tensor
    eps: float
    head_kind: str = "float32"
    head: torch.Tensor | None = None
    subset: int = 0

    def __post_init__(self) -> None:
        hidden, inter = self.hidden, self.inter
        for name, packed, outputs, inputs in (("fc", self.fc, hidden, 2 * hidden), ("gate", self.gate, inter, hidden),
                                              ("up", self.up, inter, hidden), ("down", self.down, hidden, inter)):
            _check_weight(name, self.kind, packed, outputs, inputs)
        for name, weight in (("mlp_norm", self.mlp_norm), ("norm", self.norm)):
            native._check(name, weight, torch.float32, 1, contiguous=True, shape=(hidden,))
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not self.eps > 0:
            raise ValueError(f"eps must be a positive float, got eps={self.eps!r}")
        if self.head is not None:
            _check_weight("head", self.head_kind, self.head, self.subset, hidden)


def _kind_code(name: str, kind: str) -> int:
    if kind == "float32":
        return 0
    if kind not in native.BLOCK_KINDS:
        raise ValueError(f"{name} kind must be 'float32' or one of {sorted(native.BLOCK_KINDS)}, got {kind!r}")
    return int(native.BLOCK_KINDS[kind])


def _check_weight(name: str, kind: str, packed: torch.Tensor, out_features: int, in_features: int) -> None:
    """``packed`` as the native products read an ``[out_features, in_features]`` weight of ``kind``."""
    if _kind_code(name, kind) == 0:
        native._check(name, packed, torch.float32, 3, contiguous=True, shape=(None, in_features, native.BLOCK))
    else:
        native._check(name, packed, torch.uint8, 3, contiguous=True,
                      shape=(None, None, native.group_bytes(kind)))
        if int(packed.shape[1]) * native.GROUP != in_features:
            raise ValueError(f"{name} blocks {tuple(packed.shape)} take {int(packed.shape[1]) * native.GROUP} "
                             f"inputs, not {in_features}")
    native._check_out_features(packed, out_features)


def feature_mlp(weights: FeatureMlpWeights, embeds: torch.Tensor, prev: torch.Tensor,
                head_rows: list[int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``embeds [R, H]`` and ``prev [R, H]`` (float32, CPU) -> ``(features [R, H], logits [n, S], first_max
    [n])``: every row's predicted feature and, for the ``n`` rows of ``head_rows`` (none without a head or
    with ``head_rows`` None), the subset head's logits and their index of the first maximum."""
    lib = native._library()
    assert lib is not None
    hidden = weights.hidden
    native._check("embeds", embeds, torch.float32, 2, contiguous=True, shape=(None, hidden))
    rows = int(embeds.shape[0])
    native._check("prev", prev, torch.float32, 2, contiguous=True, shape=(rows, hidden))
    picked = [] if weights.head is None or head_rows is None else [int(r) for r in head_rows]
    if any(not 0 <= r < rows for r in picked):
        raise ValueError(f"head_rows must index the {rows} rows, got head_rows={head_rows!r}")
    features = torch.empty(rows, hidden, dtype=torch.float32)
    logits = torch.empty(len(picked), weights.subset, dtype=torch.float32)
    first_max = torch.empty(len(picked), dtype=torch.int64)
    index = torch.tensor(picked, dtype=torch.int64)
    head = weights.head
    status = lib.spec_fast_feature_mlp(
        rows, hidden, weights.inter, embeds.data_ptr(), prev.data_ptr(), _kind_code("weights", weights.kind),
        weights.fc.data_ptr(), weights.mlp_norm.data_ptr(), weights.gate.data_ptr(), weights.up.data_ptr(),
        weights.down.data_ptr(), weights.norm.data_ptr(), float(weights.eps), features.data_ptr(),
        _kind_code("head", weights.head_kind), None if head is None else head.data_ptr(), weights.subset,
        len(picked), index.data_ptr(), logits.data_ptr(), first_max.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise MemoryError("the native feature head could not allocate its scratch memory")
    if not picked:
        return features, None, None
    return features, logits, first_max
