"""NDE selector in torch (spec_fast.nde.selector) against plain numpy and the spec_ref.selector oracle.

Features: entropies, KL divergences and L1 distance against a plain numpy computation (0 log 0 = 0, the
documented KL floor on disjoint supports); the latency columns against spec_ref's eq. 11. Loss: the torch
eq. 12 equals spec_ref.selector.selector_loss on random float64 batches (penalty included), and its gradient
is finite. The network: shapes, the action count of eq. 8, train/eval dropout behaviour.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from spec_fast.nde import selector as fast
from spec_ref import selector as ref


def _np_entropy(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def _np_kl(a: np.ndarray, b: np.ndarray, floor: float) -> float:
    """sum over a > 0 of a (log a - log max(b, floor)), term by term in plain Python floats."""
    total = 0.0
    for x, y in zip(a.tolist(), b.tolist()):
        if x > 0:
            total += x * (math.log(x) - math.log(max(y, floor)))
    return total


def _laws(rng: np.random.Generator, batch: int, vocab: int, zeros: float) -> np.ndarray:
    x = rng.gamma(0.5, size=(batch, vocab))
    x[rng.random((batch, vocab)) < zeros] = 0.0
    x[:, 0] += 1e-3  # never an all-zero row
    out: np.ndarray = x / x.sum(axis=1, keepdims=True)
    return out


def test_entropy_kl_l1_match_numpy_with_zeros() -> None:
    rng = np.random.default_rng(0)
    p = _laws(rng, 6, 17, zeros=0.3)
    q = _laws(rng, 6, 17, zeros=0.3)
    tp, tq = torch.from_numpy(p), torch.from_numpy(q)
    assert fast.entropy(tp).tolist() == pytest.approx([_np_entropy(r) for r in p], rel=1e-13, abs=1e-15)
    assert fast.l1_distance(tp, tq).tolist() == pytest.approx(np.abs(p - q).sum(axis=1).tolist(), rel=1e-13)
    floored = fast.kl_divergence(tp, tq).tolist()
    assert floored == pytest.approx([_np_kl(a, b, fast.KL_FLOOR) for a, b in zip(p, q)], rel=1e-12)
    assert all(math.isfinite(v) and 0 <= v <= math.log(1 / fast.KL_FLOOR) for v in floored)
    # exact KL (floor 0): +inf exactly on the rows where p has mass outside q's support
    exact = fast.kl_divergence(tp, tq, floor=0.0).tolist()
    for row, (a, b) in enumerate(zip(p, q)):
        if ((a > 0) & (b == 0)).any():
            assert exact[row] == math.inf
        else:
            assert exact[row] == pytest.approx(floored[row], rel=1e-12)


def test_point_masses_and_equal_laws() -> None:
    one_hot = torch.eye(5, dtype=torch.float64)[[1, 3]]
    assert fast.entropy(one_hot).tolist() == [0.0, 0.0]  # 0 log 0 = 0, no NaN
    uniform = torch.full((2, 5), 0.2, dtype=torch.float64)
    assert fast.entropy(uniform).tolist() == pytest.approx([math.log(5)] * 2)
    assert fast.kl_divergence(uniform, uniform).tolist() == [0.0, 0.0]
    # disjoint point masses: KL = log(1 / floor) exactly, L1 = 2
    a, b = torch.eye(5, dtype=torch.float64)[[0]], torch.eye(5, dtype=torch.float64)[[1]]
    assert fast.kl_divergence(a, b).item() == pytest.approx(math.log(1 / fast.KL_FLOOR))
    assert fast.l1_distance(a, b).item() == 2.0


def _features(rng: np.random.Generator, batch: int = 3, vocab: int = 11) -> tuple[fast.RootFeatures, dict[str, Any]]:
    p, qp, qr = (_laws(rng, batch, vocab, 0.2) for _ in range(3))
    lengths = np.array([5.0, 40.0, 17.0][:batch])
    # eq. 11 time model t_q(l) = 0.001 + 1e-5 l, t_p(l) = 0.02 + 3e-4 l
    t_q = lambda length: 0.001 + 1e-5 * length  # noqa: E731
    t_p = lambda length: 0.02 + 3e-4 * length  # noqa: E731
    inputs = dict(
        target_hidden_prev=torch.randn(batch, 7), draft_hidden_prev=torch.randn(batch, 5),
        draft_hidden_root=torch.randn(batch, 5), target_probs_prev=torch.from_numpy(p),
        draft_probs_prev=torch.from_numpy(qp), draft_probs_root=torch.from_numpy(qr),
        context_lengths=torch.from_numpy(lengths), temperature=torch.tensor([0.6, 1.0, 0.6][:batch]),
        top_p=torch.tensor([0.9, 1.0, 1.0][:batch]),
        draft_time=torch.tensor([t_q(int(n)) for n in lengths], dtype=torch.float64),
        target_time=torch.tensor([t_p(int(n)) for n in lengths], dtype=torch.float64),
    )
    return fast.root_features(**inputs), dict(p=p, qp=qp, qr=qr, lengths=lengths, t_q=t_q, t_p=t_p, inputs=inputs)


def test_root_features_columns_against_numpy_and_eq_11() -> None:
    features, raw = _features(np.random.default_rng(1))
    s = features.scalars.numpy()
    assert s.shape == (3, len(fast.SCALAR_FEATURES)) and features.scalars.dtype == torch.float64
    col = {name: s[:, i] for i, name in enumerate(fast.SCALAR_FEATURES)}
    p, qp, qr = raw["p"], raw["qp"], raw["qr"]
    for b in range(3):
        assert col["entropy_p_prev"][b] == pytest.approx(_np_entropy(p[b]), rel=1e-13)
        assert col["entropy_q_prev"][b] == pytest.approx(_np_entropy(qp[b]), rel=1e-13)
        assert col["entropy_q_root"][b] == pytest.approx(_np_entropy(qr[b]), rel=1e-13)
        assert col["kl_p_q_prev"][b] == pytest.approx(_np_kl(p[b], qp[b], fast.KL_FLOOR), rel=1e-12)
        assert col["kl_q_p_prev"][b] == pytest.approx(_np_kl(qp[b], p[b], fast.KL_FLOOR), rel=1e-12)
        assert col["l1_p_q_prev"][b] == pytest.approx(np.abs(p[b] - qp[b]).sum(), rel=1e-13)
        length = int(raw["lengths"][b])
        # the latency columns are eq. 11's single passes: (K, 0, 0) costs t_p(l); (1, 1, 0) adds t_q(l)
        assert col["target_time"][b] == pytest.approx(ref.latency_estimate(length, (1, 0, 0), raw["t_q"], raw["t_p"]))
        both = ref.latency_estimate(length, (1, 1, 0), raw["t_q"], raw["t_p"])
        assert col["draft_time"][b] == pytest.approx(both - raw["t_p"](length + 1))
    assert col["context_length"].tolist() == [5.0, 40.0, 17.0]
    unchecked = fast.root_features(**raw["inputs"], validate=False)
    assert torch.equal(unchecked.scalars, features.scalars)
    assert col["top_p"].tolist() == pytest.approx([0.9, 1.0, 1.0])


def _random_batch(rng: np.random.Generator, batch: int, actions: int) -> tuple[np.ndarray, ...]:
    logits = rng.normal(scale=2.0, size=(batch, actions))
    eff = 1.0 + rng.random((batch, actions)) * 4.0
    lat = 0.01 + rng.random((batch, actions))
    base = rng.integers(0, actions, size=batch)
    return logits, eff, lat, base


@pytest.mark.parametrize("seed,batch,actions,lam,alpha", [
    (0, 30, 324, 2.0, 0.1), (1, 7, 5, 0.5, 0.3), (2, 1, 3, 1.0, 1.0), (3, 64, 12, 10.0, 0.05), (4, 16, 324, 0.0, 0.5),
])
def test_torch_loss_equals_spec_ref_loss(seed: int, batch: int, actions: int, lam: float, alpha: float) -> None:
    logits, eff, lat, base = _random_batch(np.random.default_rng(seed), batch, actions)
    want = ref.selector_loss(logits, eff, lat, base, lam, alpha)
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    got = fast.selector_loss(z, torch.from_numpy(eff), torch.from_numpy(lat), torch.from_numpy(base), lam, alpha)
    assert got.total.item() == pytest.approx(want.total, rel=1e-12, abs=1e-14)
    assert got.log_term.item() == pytest.approx(want.log_term, rel=1e-12, abs=1e-14)
    assert got.penalty.item() == pytest.approx(want.penalty, rel=1e-12, abs=1e-15)
    assert got.ratios.tolist() == pytest.approx(list(want.ratios), rel=1e-13)
    assert got.worst_indices.tolist() == list(want.worst_indices)
    got.total.backward()
    assert z.grad is not None and bool(torch.isfinite(z.grad).all())


def test_loss_penalty_actually_counts_regressions() -> None:
    """Negative control for the penalty term: a policy worse than the baseline pays lambda * penalty."""
    eff = torch.tensor([[1.0, 3.0], [1.0, 3.0]], dtype=torch.float64)
    lat = torch.ones(2, 2, dtype=torch.float64)
    bad = torch.tensor([[10.0, -10.0], [10.0, -10.0]], dtype=torch.float64)  # picks the worse action
    base = torch.tensor([1, 1])
    no_penalty = fast.selector_loss(bad, eff, lat, base, 0.0, 1.0)
    with_penalty = fast.selector_loss(bad, eff, lat, base, 3.0, 1.0)
    assert with_penalty.total.item() > no_penalty.total.item() + 1.0
    assert with_penalty.penalty.item() == pytest.approx(ref.selector_loss(bad.numpy(), eff.numpy(), lat.numpy(), base.numpy(), 3.0, 1.0).penalty)


def test_policy_and_action_throughput_mirror_spec_ref() -> None:
    logits, eff, lat, base = _random_batch(np.random.default_rng(5), 4, 9)
    pi = ref.policy_probs(logits)
    got = fast.policy_throughput(torch.from_numpy(pi), torch.from_numpy(eff), torch.from_numpy(lat))
    assert got.tolist() == pytest.approx(ref.policy_throughput(pi, eff, lat).tolist(), rel=1e-14)
    got_a = fast.action_throughput(torch.from_numpy(eff), torch.from_numpy(lat), torch.from_numpy(base))
    assert got_a.tolist() == pytest.approx(ref.action_throughput(eff, lat, base).tolist(), rel=1e-14)


def test_net_shapes_action_space_and_dropout() -> None:
    torch.manual_seed(0)
    config = fast.SelectorConfig(target_hidden_size=7, draft_hidden_size=5)
    assert config.num_actions == 324 and config.actions == ref.action_space()
    net = fast.SelectorNet(config)
    features, _ = _features(np.random.default_rng(2))
    net.set_standardization(features.scalars)
    net.eval()
    logits = net(features)
    assert logits.shape == (3, 324) and logits.dtype == torch.float32
    assert torch.equal(net(features), logits)  # eval: deterministic
    chosen = net.select(features)
    assert chosen.shape == (3,) and chosen.tolist() == net.representative(net.tree_probs(logits).argmax(dim=-1)).tolist()
    net.train()
    assert not torch.equal(net(features), logits)  # dropout is active in training
    # standardised scalars: zero mean over the set they were fitted on
    mean: torch.Tensor = net.scalar_mean  # type: ignore[assignment]
    assert mean.tolist() == pytest.approx(features.scalars.mean(dim=0).tolist(), rel=1e-6)
    small = fast.SelectorNet(fast.SelectorConfig(7, 5, max_branches=2, max_trunk=1, max_branch_length=1))
    assert small.mlp[-1].out_features == 8


def test_the_selector_decodes_the_most_probable_tree_and_caps_logits() -> None:
    """Eq. (8) lists one tree under several actions: 324 actions, 233 trees; a tree whose probability is
    spread over its actions wins over a single action of higher probability (the argmax of the raw policy,
    the control, picks that single action); a logit cap bounds every logit."""
    actions = ref.action_space()
    group, first = fast.tree_groups(actions)
    assert int(group.max()) + 1 == 233 and first.numel() == 233
    index = {a: i for i, a in enumerate(actions)}
    chain1 = [index[a] for a in ((1, 0, 1), (1, 1, 0), (2, 1, 0), (3, 1, 0), (4, 1, 0))]
    assert len({int(group[i]) for i in chain1}) == 1 and int(group[index[(2, 0, 1)]]) != int(group[chain1[0]])
    assert {int(group[index[(k, 0, 0)]]) for k in range(1, 5)} == {int(group[index[(1, 0, 0)]])}
    net = fast.SelectorNet(fast.SelectorConfig(7, 5)).eval()
    logits = torch.full((1, 324), -20.0)
    logits[0, chain1] = 0.0  # five actions of one tree, 0.2 of its mass each after the plain step's share
    logits[0, index[(2, 2, 2)]] = 0.5  # one action, more probable than any single chain:1 action
    assert int(logits.argmax()) == index[(2, 2, 2)]
    tree = net.tree_probs(logits).argmax(dim=-1)
    assert net.representative(tree).tolist() == [index[(1, 0, 1)]]
    capped = fast.SelectorNet(fast.SelectorConfig(7, 5, logit_cap=2.0)).eval()
    features, _ = _features(np.random.default_rng(3))
    with torch.no_grad():
        for p in capped.mlp.parameters():
            p.mul_(50.0)
        assert float(capped(features).abs().max()) <= 2.0


@pytest.mark.parametrize("call,match", [
    (lambda: fast.entropy(torch.ones(3)), "probs must have shape \\[B, V\\]"),
    (lambda: fast.entropy(torch.tensor([[0.5, -0.1]])), "probs must be finite and non-negative"),
    (lambda: fast.kl_divergence(torch.ones(1, 2) / 2, torch.ones(1, 3) / 3), "first.shape"),
    (lambda: fast.kl_divergence(torch.ones(1, 2) / 2, torch.ones(1, 2) / 2, floor=1.0), "floor must lie in"),
    (lambda: fast.l1_distance(torch.ones(1, 2), torch.tensor([[float("nan"), 0.0]])), "second must be finite"),
    (lambda: fast.SelectorConfig(0, 5), "target_hidden_size must be an integer >= 1"),
    (lambda: fast.SelectorConfig(4, 5, dropout=1.0), "dropout must lie in"),
    (lambda: fast.SelectorConfig(4, 5, max_branches=0), "max_branches must be an integer >= 1"),
    (lambda: fast.selector_loss(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), torch.tensor([0, 1]), -1.0, 0.5),
     "penalty_weight must be finite and >= 0"),
    (lambda: fast.selector_loss(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), torch.tensor([0, 1]), 1.0, 0.0),
     "worst_fraction must lie in"),
    (lambda: fast.selector_loss(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3), torch.tensor([0, 1]), 1.0, 0.5),
     "latency must be positive"),
    (lambda: fast.selector_loss(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), torch.tensor([0, 3]), 1.0, 0.5),
     "actions must lie in"),
    (lambda: fast.selector_loss(torch.tensor([[float("inf"), 0.0]]), torch.ones(1, 2), torch.ones(1, 2), torch.tensor([0]), 1.0, 0.5),
     "logits must be finite"),
])
def test_bad_input_raises_value_error_naming_it(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_root_features_reject_bad_shapes_and_values() -> None:
    _, raw = _features(np.random.default_rng(3))
    good = dict(
        target_hidden_prev=torch.zeros(3, 7), draft_hidden_prev=torch.zeros(3, 5), draft_hidden_root=torch.zeros(3, 5),
        target_probs_prev=torch.from_numpy(raw["p"]), draft_probs_prev=torch.from_numpy(raw["qp"]),
        draft_probs_root=torch.from_numpy(raw["qr"]), context_lengths=torch.ones(3), temperature=torch.ones(3),
        top_p=torch.ones(3), draft_time=torch.ones(3), target_time=torch.ones(3),
    )
    fast.root_features(**good)
    for key, value, match in [
        ("draft_hidden_root", torch.zeros(2, 5), "draft_hidden_root must be \\[B=3, Hq\\]"),
        ("draft_probs_root", torch.ones(3, 4) / 4, "draft_probs_root must be \\[B=3, V=11\\]"),
        ("temperature", torch.ones(2), "temperature.shape"),
        ("draft_time", torch.tensor([1.0, -1.0, 1.0]), "draft_time must be finite and non-negative"),
    ]:
        with pytest.raises(ValueError, match=match):
            fast.root_features(**{**good, key: value})
