"""Batched sampling primitives of the verification kernels, the ``spec_ref/_sampling.py`` conventions on
``[R, V]`` float32 tensors (docs/algorithms.md section 9).

Inverse-CDF draws (:func:`_inverse_cdf`, float64 prefix sums, two-level for large vocabularies), residuals
with the fallback to the current target (:func:`_residual_weights`), float64 row sums, and the row selection
(:class:`_Rows`) that restricts ``[rows, V]`` work to the rows that need it on CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor
#: dtype of the [rows, V] arithmetic (residuals, partial sums); reductions accumulate in float64 and every
#: scalar test is evaluated in float64.
_WORK = torch.float32
F64 = torch.float64


#: Set by :mod:`spec_fast.lean.row_ops` when it is imported: ``values [R, V]`` (CPU float32) -> the indices
#: :func:`first_max_index` returns, from its C sweep, or None where that library is not loaded.
native_first_max: Callable[[Tensor], Tensor | None] | None = None
#: Set by :mod:`spec_fast.lean.row_ops` too: ``(logits [R, V], temperature [R], uniforms [R])`` (CPU float32) ->
#: one draw per row from ``softmax((logits - max) / T)`` in one native sweep, or None where the library is not
#: loaded or the logits do not suit it.
native_tempered_draw: Callable[[Tensor, Tensor, Tensor], Tensor | None] | None = None
#: And ``(logits [R, V], temperature [R], top_k [R], top_p [R], uniforms [R])`` -> one draw per row from G with
#: top-k and top-p, ordering only the tokens the cuts need, or None where the library is not loaded.
native_filtered_draw: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor | None] | None = None
#: And ``(logits [R, N, V], temperature [R], child [R, N], draft_probs [R, N, V], u0 [R, N], u1 [R, N])`` -> each
#: row's stop slot and next token: the naive verification of chains against the tempered softmax, or None.
native_naive_chain: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor] | None] | None \
    = None
#: The native sweep takes argmaxes over at least this many values (several rows of logits): over one row
#: of 49152 it saved ~20 us a call, which the Python around it cost back in a decoding step (scratch A/B)
NATIVE_FIRST_MAX_FROM = 65536


def first_max_index(values: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    """``torch.argmax(values, dim, keepdim)``: the index of the first maximum (the lowest on ties; a NaN counts
    as the maximum). On the CPU, float32 along the last dimension and at least :data:`NATIVE_FIRST_MAX_FROM`
    values, it is the native library's sweep where that is loaded (:data:`native_first_max`: the same
    indices; 0.11 ms for the five rows of a depth-4 chain's logits where torch's reduction took 0.30 ms after
    a pass, and 0.9 ms for four such requests, on one thread), else ``torch.max(dim)``'s indices, which follow
    the same rules in a fraction of argmax's time there; elsewhere it is ``torch.argmax``."""
    if values.device.type == "cpu":
        if (native_first_max is not None and values.dtype == torch.float32 and values.dim() >= 1
                and dim in (-1, values.dim() - 1) and values.shape[-1] > 0
                and values.numel() >= NATIVE_FIRST_MAX_FROM):
            found = native_first_max(values.reshape(-1, values.shape[-1]))
            if found is not None:
                found = found.view(values.shape[:-1])
                return found.unsqueeze(-1) if keepdim else found
        return values.max(dim=dim, keepdim=keepdim).indices
    return values.argmax(dim=dim, keepdim=keepdim)


def _rowsum(values: Tensor, keepdim: bool = False) -> Tensor:
    """Row sums ``[R]`` (or ``[R, 1]``) as float64. The reduction runs in the input dtype (torch's cascade
    summation, relative error ~1e-7 in float32) and is cast afterwards: ``sum(dtype=float64)`` would first
    materialise a float64 copy of the whole ``[R, V]`` tensor."""
    return values.sum(dim=1, keepdim=keepdim).to(F64)


#: Vocabularies from this size on use the two-level inverse CDF (chunk totals, then one chunk).
_CHUNKED_CDF_MIN_VOCAB = 8192
_CDF_CHUNK = 1024


def _inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """Smallest index with ``cumsum > u * total`` per row; never a zero-weight index.

    ``weights [R, V]`` non-negative with positive row sums; ``u [R]``. Returns ``[R]`` long. Cumulative sums
    are float64. For large V the search is two-level: float64 prefix sums of per-chunk float64 totals pick
    the chunk, then one ``[R, chunk]`` float64 prefix sum picks the index (boundaries within ~1e-13 of the
    mass of the reference's sequential float64 cumsum at V = 262144).
    """
    rows, vocab = weights.shape
    u64 = u.to(F64).unsqueeze(1)
    if vocab < _CHUNKED_CDF_MIN_VOCAB:
        cumulative = torch.cumsum(weights, dim=1, dtype=F64)  # [R, V]
        total = cumulative[:, -1:].contiguous()  # [R, 1]
        index = torch.searchsorted(cumulative, u64 * total, right=True)
        # If rounding pushes u * total onto the total, take the last index of positive weight: the first
        # index whose partial sum reaches the total.
        last_positive = torch.searchsorted(cumulative, total, right=False)
        # NaN weights (unvalidated input) make searchsorted return V: the clamp keeps every id in [0, V)
        return torch.minimum(index, last_positive).squeeze(1).clamp_(0, vocab - 1)
    size = _CDF_CHUNK
    full = vocab // size
    # Chunk totals accumulate in float64: float32 totals move every boundary by ~1e-7 of the mass (and a
    # float32 cumulative sum over V = 151936 by ~1e-5), enough to change the token for a uniform next to a
    # CDF boundary. Summing in float64 keeps the two-level search within ~1e-13 of the reference's
    # sequential float64 cumsum.
    sums = [weights[:, : full * size].reshape(rows, full, size).sum(dim=2, dtype=F64)]
    if full * size < vocab:
        sums.append(weights[:, full * size :].sum(dim=1, keepdim=True, dtype=F64))
    chunk_sums = torch.cat(sums, dim=1)  # [R, C] float64
    chunk_cum = torch.cumsum(chunk_sums, dim=1)
    total = chunk_cum[:, -1:].contiguous()
    threshold = u64 * total
    chunk = torch.searchsorted(chunk_cum, threshold, right=True)
    last_chunk = torch.searchsorted(chunk_cum, total, right=False)
    chunk = torch.minimum(chunk, last_chunk)  # [R, 1], a chunk of positive total
    before = torch.where(chunk > 0, chunk_cum.gather(1, (chunk - 1).clamp(min=0)), torch.zeros_like(threshold))
    columns = chunk * size + torch.arange(size, device=weights.device).unsqueeze(0)  # [R, size]
    inside = columns < vocab
    zero = torch.zeros((), dtype=weights.dtype, device=weights.device)
    values = torch.where(inside, weights.gather(1, columns.clamp(max=vocab - 1)), zero)
    within = torch.cumsum(values, dim=1, dtype=F64)
    pick = torch.searchsorted(within, (threshold - before).contiguous(), right=True)
    last_in_chunk = torch.searchsorted(within, within[:, -1:].contiguous(), right=False)
    return (chunk * size + torch.minimum(pick, last_in_chunk)).squeeze(1).clamp_(0, vocab - 1)


def _residual_weights(base: Tensor, subtract: Tensor, subtract_rows: Tensor | None = None) -> Tensor:
    """``(base - subtract)_+`` per row, or ``base`` where that mass is ``<= 0`` (the current target).

    ``subtract_rows [R]`` bool (optional): only these rows subtract; the others get exactly ``base``.
    Built as one new ``[R, V]`` tensor updated in place.
    """
    if subtract_rows is None:
        mass = base - subtract
    else:
        mass = torch.addcmul(base, subtract, -subtract_rows.to(base.dtype).unsqueeze(1))
    mass.clamp_min_(0)
    empty = (_rowsum(mass) <= 0).to(base.dtype).unsqueeze(1)
    return mass.addcmul_(base, empty)  # an empty row is all zeros: adding base gives exactly base


def _take(values: Tensor, index: Tensor) -> Tensor:
    """``values[r, index[r]]`` for ``values [R, V]``, ``index [R]`` (clamped to >= 0)."""
    return values.gather(1, index.clamp(min=0).unsqueeze(1)).squeeze(1)


class _Rows:
    """Row selection for ``[rows, V]`` work: all rows (device path) or the rows that need it (compact)."""

    def __init__(self, compact: bool) -> None:
        self.compact = compact

    def select(self, need: Tensor) -> Tensor | None:
        """Indices of the rows of ``need [R]`` to compute, or None for "all rows, masked"."""
        if not self.compact:
            return None
        return need.nonzero().squeeze(1)

    def draw(self, need: Tensor, weights_fn: Callable[[Tensor | None], Tensor], u: Tensor) -> Tensor:
        """Inverse-CDF draws ``[R]`` for the rows in ``need`` (others: 0); ``weights_fn(idx) -> [r, V]``."""
        idx = self.select(need)
        if idx is None:
            return _inverse_cdf(weights_fn(None), u)
        out = torch.zeros(need.shape[0], dtype=torch.long, device=need.device)
        if idx.numel():
            out[idx] = _inverse_cdf(weights_fn(idx), u[idx])
        return out


def _sub(t: Tensor, idx: Tensor | None) -> Tensor:
    return t if idx is None else t[idx]
