"""Bad values at the public spec_fast verifiers (docs/algorithms.md section 9, docs/testing.md section 6):
a ValueError naming the argument and the value; the internal path (``validate=False``) never emits an id
outside [0, V)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import spec_ref
from spec_fast import METHODS, counter_uniforms, decoding_operator, solver_branching, solver_sample, uniforms_per_node, verify_tree
from spec_fast._validate import probability_sum_tolerance
from tests.fast.test_kernels_helpers import Batch, random_batch, single_thread_torch

__all__ = ["single_thread_torch"]

VOCAB = 5


def _batch() -> tuple[Batch, torch.Tensor, torch.Tensor]:
    batch = random_batch(np.random.default_rng(4), 4, VOCAB, 2, 2)  # row 1 has draws at the root
    target, draft = batch.tensors()
    return batch, target, draft


def _uniforms(method: str, batch: Batch) -> torch.Tensor:
    m = uniforms_per_node(method, batch.flat.max_draws)
    return counter_uniforms(1, 0, (4, batch.flat.num_slots, m))


def _corrupt(kind: str, target: torch.Tensor, draft: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, ...]:
    target, draft, uniforms = target.clone(), draft.clone(), uniforms.clone()
    if kind == "nan_target":
        target[1, 0, 2] = float("nan")
    elif kind == "inf_target":
        target[1, 0, 2] = float("inf")
    elif kind == "zero_target_row":
        target[1, 0, :] = 0.0
    elif kind == "negative_target":
        target[1, 0, 2] = -0.25
    elif kind == "unnormalised_target":
        target[1, 0, :] *= 0.5
    elif kind == "nan_draft":
        draft[1, 0, 2] = float("nan")
    elif kind == "negative_draft":
        draft[1, 0, 2] = -0.25
    elif kind == "unnormalised_draft":
        draft[1, 0, :] *= 1.5
    elif kind == "nan_uniform":
        uniforms[1, 0, 0] = float("nan")
    elif kind == "uniform_one":
        uniforms[1, 0, 0] = 1.0
    return target, draft, uniforms


KINDS = {
    "nan_target": r"target_probs must be finite, got target_probs\[1, 0, 2\]=nan",
    "inf_target": r"target_probs must be finite, got target_probs\[1, 0, 2\]=inf",
    "zero_target_row": r"sum\(target_probs\[1, 0\]\)=0\.0",
    "negative_target": r"target_probs must be non-negative, got target_probs\[1, 0, 2\]=-0\.25",
    "unnormalised_target": r"sum\(target_probs\[1, 0\]\)=0\.(5|49)",
    "nan_draft": r"draft_probs must be finite, got draft_probs\[1, 0, 2\]=nan",
    "negative_draft": r"draft_probs must be non-negative, got draft_probs\[1, 0, 2\]=-0\.25",
    "unnormalised_draft": r"sum\(draft_probs\[1, 0\]\)=1\.5",
    "nan_uniform": r"uniforms must lie in \[0, 1\), got uniforms\[1, 0, 0\]=nan",
    "uniform_one": r"uniforms must lie in \[0, 1\), got uniforms\[1, 0, 0\]=1\.0",
}
SAMPLING = [m for m in METHODS if m not in ("greedy", "dynatree")]


@pytest.mark.parametrize(
    ("method", "kind"), [(m, k) for m in SAMPLING for k in KINDS if not (m == "nss" and "draft" in k)]
)  # nss never reads q (documented), so its draft_probs are not checked
def test_verify_tree_refuses_bad_values_naming_the_argument_and_value(method: str, kind: str) -> None:
    batch, target, draft = _batch()
    target, draft, uniforms = _corrupt(kind, target, draft, _uniforms(method, batch))
    with pytest.raises(ValueError, match=KINDS[kind]):
        verify_tree(method, batch.flat, target, draft, uniforms)


@pytest.mark.parametrize("kind", ["nan_target", "inf_target", "zero_target_row", "negative_target"])
@pytest.mark.parametrize("method", ["greedy", "dynatree"])
def test_greedy_verifiers_refuse_bad_target_rows(method: str, kind: str) -> None:
    batch, target, draft = _batch()
    target, draft, uniforms = _corrupt(kind, target, draft, _uniforms(method, batch))
    with pytest.raises(ValueError, match=KINDS[kind]):
        verify_tree(method, batch.flat, target, draft, uniforms)


def test_drafted_token_ids_outside_the_vocabulary_are_refused() -> None:
    batch, target, draft = _batch()
    tokens = batch.flat.tokens.clone()
    tokens[0, 1] = -3
    flat = type(batch.flat)(tokens, batch.flat.parents, batch.flat.depths, batch.flat.draws, batch.flat.valid)
    with pytest.raises(ValueError, match=r"tree.tokens\[0, 1\]=-3"):
        verify_tree("bv", flat, target, draft, _uniforms("bv", batch))
    draws = batch.flat.draws.clone()
    draws[0, 0, 0] = VOCAB
    flat = type(batch.flat)(batch.flat.tokens, batch.flat.parents, batch.flat.depths, draws, batch.flat.valid)
    with pytest.raises(ValueError, match=rf"tree.draws.*={VOCAB}"):
        verify_tree("naive_tree", flat, target, draft, _uniforms("naive_tree", batch))


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "dense"])
@pytest.mark.parametrize("kind", ["nan_target", "inf_target", "zero_target_row", "negative_target", "nan_draft",
                                  "negative_draft", "nan_uniform"])
@pytest.mark.parametrize("method", [m for m in METHODS if m != "khisti"])
def test_the_unvalidated_internal_path_never_emits_an_id_outside_the_vocabulary(method: str, kind: str, compact: bool) -> None:
    """Every row corrupted (all slots): NaN/inf/zero rows used to give id V (verify_tree), negative ids
    (bv, tree_mc) or an IndexError. Khisti hands the row to the reference LP, which raises instead."""
    batch, target, draft = _batch()
    uniforms = _uniforms(method, batch)
    fill = {"nan_target": float("nan"), "inf_target": float("inf"), "zero_target_row": 0.0, "negative_target": -0.5}
    if kind in fill:
        target = torch.full_like(target, fill[kind])
    elif kind == "nan_draft":
        draft = torch.full_like(draft, float("nan"))
    elif kind == "negative_draft":
        draft = torch.full_like(draft, -0.5)
    elif uniforms.shape[2]:
        uniforms = torch.full_like(uniforms, float("nan"))
    out = verify_tree(method, batch.flat, target, draft, uniforms, validate=False, compact=compact)
    for b in range(4):
        emitted = out.emitted[b, : int(out.accepted_depth[b]) + 1]
        assert bool(((emitted >= 0) & (emitted < VOCAB)).all()), (b, emitted.tolist())
        assert 0 <= int(out.next_token[b]) < VOCAB
        assert bool(batch.flat.valid[b, int(out.accepted_node[b])])


@pytest.mark.parametrize("kind", ["nan_target", "negative_target", "unnormalised_target", "nan_draft", "nan_uniform"])
def test_solver_kernels_refuse_bad_values(kind: str) -> None:
    rng = np.random.default_rng(4)
    p = torch.from_numpy(rng.dirichlet(np.ones(VOCAB), size=3)).to(torch.float32)
    q = torch.from_numpy(rng.dirichlet(np.ones(VOCAB), size=3)).to(torch.float32)
    tokens = torch.tensor([[0, 1], [2, -1], [3, 3]])
    uniforms = torch.full((3, 5), 0.5)
    target, draft, uniforms = _corrupt(kind, p.unsqueeze(1), q.unsqueeze(1), uniforms.unsqueeze(1))
    target, draft, uniforms = target[:, 0], draft[:, 0], uniforms[:, 0]
    message = KINDS[kind].replace(r"\[1, 0, 2\]", r"\[1, 2\]").replace(r"\[1, 0\]", r"\[1\]").replace(r"\[1, 0, 0\]", r"\[1, 0\]")
    with pytest.raises(ValueError, match=message):
        solver_sample("spectr", target, draft, tokens, uniforms)
    if kind != "nan_uniform":
        with pytest.raises(ValueError, match=message):
            solver_branching("naive", target, draft, tokens)
    with pytest.raises(ValueError, match=r"draft_tokens\[0, 1\]=-2"):
        solver_sample("naive", p, q, torch.tensor([[0, -2], [1, -1], [2, 2]]), torch.full((3, 5), 0.5))


def test_sum_tolerance_scales_with_dtype_and_vocabulary() -> None:
    assert probability_sum_tolerance(torch.float64, 8) == pytest.approx(1e-6, rel=1e-6)
    assert probability_sum_tolerance(torch.float32, 262144) > 1e-4 > probability_sum_tolerance(torch.float32, 8)
    assert probability_sum_tolerance(torch.bfloat16, 1024) > probability_sum_tolerance(torch.float32, 1024)


@pytest.mark.parametrize("vocab", [49152, 262144])
def test_float32_softmax_rows_at_real_vocabularies_pass_validation(vocab: int) -> None:
    """A float32 softmax over V = 49152 sums to 1 only within ~4e-6 (the old fixed 1e-6 stopped Khisti
    mid-stream); unnormalised rows are still refused."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(16, vocab, generator=gen) * 10
    probs = torch.softmax(logits, dim=1)
    worst = float((probs.sum(dim=1, dtype=torch.float64) - 1).abs().max())
    from spec_fast._validate import check_probabilities

    check_probabilities("target_probs", probs)
    assert worst < probability_sum_tolerance(torch.float32, vocab)
    with pytest.raises(ValueError, match="sum"):
        check_probabilities("target_probs", probs * 0.999)


def _khisti_root_batch(target: torch.Tensor, draft: torch.Tensor, draws: list[int]) -> tuple[Any, torch.Tensor, torch.Tensor]:
    from spec_fast import FlatTree

    k = len(draws)
    distinct = list(dict.fromkeys(draws))
    n = 1 + len(distinct)
    tokens = torch.tensor([[-1] + distinct])
    parents = torch.tensor([[-1] + [0] * len(distinct)])
    depths = torch.tensor([[0] + [1] * len(distinct)])
    dr = torch.full((1, n, k), -1, dtype=torch.long)
    dr[0, 0] = torch.tensor(draws)
    flat = FlatTree(tokens, parents, depths, dr, torch.ones(1, n, dtype=torch.bool))
    return flat, target.expand(1, n, -1).contiguous(), draft.expand(1, n, -1).contiguous()


def test_khisti_accepts_float32_softmax_rows_of_a_real_vocabulary() -> None:
    """--verifier khisti at T > 0 without top-p/top-k: p and q are float32 softmaxes over V = 49152."""
    gen = torch.Generator().manual_seed(1)
    vocab = 49152
    p = torch.softmax(torch.randn(vocab, generator=gen) * 3, dim=0)
    q = torch.softmax(torch.randn(vocab, generator=gen) * 3, dim=0)
    assert abs(float(p.sum(dtype=torch.float64)) - 1) > 1e-7 or abs(float(q.sum(dtype=torch.float64)) - 1) > 1e-7
    draws = [int(torch.argmax(q)), int(torch.argsort(q, descending=True)[1])]
    flat, target, draft = _khisti_root_batch(p, q, draws)
    uniforms = counter_uniforms(3, 0, (1, flat.num_slots, 3))
    for validate in (True, False):
        out = verify_tree("khisti", flat, target, draft, uniforms, validate=validate)
        assert 0 <= int(out.next_token[0]) < vocab


def test_khisti_refuses_too_many_draws_before_any_work() -> None:
    p = torch.full((4,), 0.25)
    flat, target, draft = _khisti_root_batch(p, p, [0, 1, 2, 3] * 65)
    with pytest.raises(ValueError, match="tree.max_draws=260 is more than 256"):
        verify_tree("khisti", flat, target, draft, torch.zeros(1, flat.num_slots, 261))
    with pytest.raises(ValueError, match="k=300"):
        spec_ref.KhistiSolver().plan(np.full(4, 0.25), np.full(4, 0.25), 300)


# ---------------------------------------------------------------------------------------------- decoding
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"temperature": -0.5}, r"temperature must be finite and >= 0, got temperature\[1\]=-0\.5"),
        ({"temperature": float("nan")}, r"temperature\[1\]=nan"),
        ({"top_k": -1}, r"top_k\[1\]=-1"),
        ({"top_p": 0.0}, r"top_p\[1\]=0\.0"),
        ({"top_p": 1.5}, r"top_p\[1\]=1\.5"),
        ({"logit": float("nan")}, r"logits\[1, 2\]=nan"),
        ({"logit": float("inf")}, r"logits\[1, 2\]=inf"),
        ({"row": float("-inf")}, r"logits\[1\] all -inf"),
    ],
)
def test_decoding_operator_refuses_bad_parameters_and_logits(change: dict[str, float], message: str) -> None:
    logits = torch.zeros(2, 4)
    temperature, top_k, top_p = torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2)
    if "temperature" in change:
        temperature[1] = change["temperature"]
    if "top_k" in change:
        top_k[1] = int(change["top_k"])
    if "top_p" in change:
        top_p[1] = change["top_p"]
    if "logit" in change:
        logits[1, 2] = change["logit"]
    if "row" in change:
        logits[1, :] = change["row"]
    with pytest.raises(ValueError, match=message):
        decoding_operator(logits, temperature, top_k, top_p)


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 1e-300])
@pytest.mark.parametrize("top_p", [1.0, 0.4])
def test_a_tiny_temperature_is_the_zero_temperature_limit_in_both_operators(temperature: float, top_p: float) -> None:
    """logits / 1e-38 overflows float32 (NaN softmax, then token V in the engine): both operators give
    the T -> 0 limit, uniform over the tied maxima, cut by top-p with the lowest id first."""
    logits = torch.tensor([[0.0, 30.0, 30.0, float("-inf"), 29.9, -1e4]])
    probs = decoding_operator(
        logits, torch.tensor([temperature], dtype=torch.float64), torch.zeros(1, dtype=torch.long), torch.tensor([top_p])
    )
    expected = spec_ref.decoding_operator(logits[0].double().numpy(), temperature, top_p=top_p if top_p < 1 else None)
    assert bool(torch.isfinite(probs).all())
    assert probs[0].tolist() == expected.tolist() == ([0.0, 0.5, 0.5, 0.0, 0.0, 0.0] if top_p == 1 else [0.0, 1.0, 0, 0, 0, 0])


def test_reference_operator_at_a_tiny_temperature_does_not_overflow_float64() -> None:
    with np.errstate(all="raise"):
        probs = spec_ref.decoding_operator([1e10, 0.0, 1e10], 1e-300)
    assert probs.tolist() == [0.5, 0.0, 0.5]


# ---------------------------------------------------------------------------------------------- seeds
@pytest.mark.parametrize("seed", [2**64, 2**65 + 3, -(2**63) - 1])
def test_counter_uniforms_refuse_seeds_that_do_not_fit_in_64_bits(seed: int) -> None:
    with pytest.raises(ValueError, match=f"seed={seed}"):
        counter_uniforms(seed, 0, (3,))
    with pytest.raises(ValueError, match=f"offset={seed}"):
        counter_uniforms(0, seed, (3,))


# ---------------------------------------------------------------------------------------------- degenerate
@pytest.mark.parametrize("compact", [True, False], ids=["compact", "dense"])
@pytest.mark.parametrize("method", ["naive_tree", "spectr", "specinfer", "naive", "bv", "tree_mc", "traversal"])
def test_a_zero_residual_falls_back_to_the_target_never_to_uniform(method: str, compact: bool) -> None:
    """p = (1 - 2**-21) q (unnormalised within tolerance, docs/testing.md section 6 item 2): a uniform just
    below 1 rejects the draft while (p - q)+ is all zero, so the correction must come from p itself: never
    token 4, where p = q = 0 (a uniform fallback would pick it at this uniform)."""
    from tests.fast.test_kernels_parity import _single_node_batch

    q = np.array([0.5, 0.25, 0.125, 0.125, 0.0])
    p = q * (1 - 2.0**-21)
    batch = _single_node_batch(p, q, [0, 1])
    target, draft = batch.tensors()
    m = uniforms_per_node(method, batch.flat.max_draws)
    uniforms = torch.full((1, batch.flat.num_slots, m), 1.0 - 2.0**-24)
    out = verify_tree(method, batch.flat, target, draft, uniforms, compact=compact)
    assert 4 not in out.emitted[0].tolist() and int(out.next_token[0]) != 4, out.emitted.tolist()
