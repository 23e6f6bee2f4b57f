"""The eq. 11 warm-up microbenchmark (spec_fast.nde.latency) on tiny random models: a valid, positive, monotone
latency model that feeds spec_ref.selector.latency_table, a non-negative fit, and the JSON cache."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from spec_fast.drafts.model import ModelDrafter
from spec_fast.nde.latency import (
    LatencyModel,
    PassTime,
    PassTimeFit,
    PassTimeTable,
    cache_key,
    fit_pass_table,
    fit_pass_time,
    load_or_measure,
    measure_latency,
    measure_pass_times,
)
from spec_ref.selector import action_space, latency_estimate
from tests.engine.models import tiny_llama


def test_warm_up_gives_a_positive_monotone_model_that_feeds_eq_11() -> None:
    torch.manual_seed(0)
    target, draft = ModelDrafter(tiny_llama(layers=4, seed=1)), ModelDrafter(tiny_llama(layers=1, seed=2))
    model = measure_latency(target, draft, vocab_size=64, contexts=(8, 24), target_widths=(1, 9, 41),
                            draft_widths=(1, 4), repeats=2)
    for fit in (model.draft, model.target):
        assert isinstance(fit, PassTimeTable) and fit.per_context >= 0
        assert all(b > 0 for b in fit.base) and list(fit.base) == sorted(fit.base)
    lengths = [1, 10, 60]
    assert all(model.draft_time(a) <= model.draft_time(b) for a, b in zip(lengths, lengths[1:]))
    assert all(model.target_time(a) <= model.target_time(b) for a, b in zip(lengths, lengths[1:]))
    actions = action_space()
    table = model.latency_table(20, actions)
    assert table.shape == (324,) and table.dtype == np.float64 and bool(np.all(table > 0))
    # a bigger tree never costs less: adding a trunk token, a branch or a branch token
    index = {a: i for i, a in enumerate(actions)}
    for k, l1, l2 in actions:
        for bigger in ((k, l1 + 1, l2), (k + 1, l1, l2), (k, l1, l2 + 1)):
            if bigger in index:
                assert table[index[bigger]] >= table[index[(k, l1, l2)]]
    t_q, t_p = model.time_models(20)
    assert table[index[(2, 1, 3)]] == pytest.approx(latency_estimate(20, (2, 1, 3), t_q, t_p))
    assert t_p(20 + 1 + 6) == pytest.approx(model.target(20, 8))  # the target pass over root + 7 drafted nodes


def test_pass_times_cover_the_grid_and_leave_the_cache_clean() -> None:
    drafter = ModelDrafter(tiny_llama(layers=1, seed=3))
    points = measure_pass_times(drafter, 64, contexts=(5, 7), widths=(1, 3), repeats=1)
    assert [(p.context, p.width) for p in points] == [(5, 1), (5, 3), (7, 1), (7, 3)]
    assert all(p.seconds > 0 for p in points)
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        measure_pass_times(drafter, 64, contexts=(5,), widths=(1,), repeats=0)
    with pytest.raises(ValueError, match="contexts and widths"):
        measure_pass_times(drafter, 64, contexts=(), widths=(1,))


def test_fit_recovers_an_exact_linear_law_and_stays_non_negative() -> None:
    law = PassTimeFit(0.01, 0.002, 0.0001)
    points = [PassTime(c, w, law(c, w)) for c in (10, 50, 200) for w in (1, 4, 16)]
    fit = fit_pass_time(points)
    assert (fit.intercept, fit.per_width, fit.per_context) == pytest.approx((0.01, 0.002, 0.0001), rel=1e-9)
    # times that fall with the context: least squares would give a negative slope, NNLS clips it to 0
    falling = [PassTime(c, 1, 1.0 - 0.001 * c) for c in (10, 100, 200)]
    assert fit_pass_time(falling).per_context == 0.0
    with pytest.raises(ValueError, match="intercept must be a positive"):
        PassTimeFit(0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="measured seconds must be positive"):
        fit_pass_time([PassTime(1, 1, 0.0)])


def test_table_fit_recovers_a_bent_width_law_and_never_falls() -> None:
    """A CPU-like law (the second token costs 0.6 of the first, the next ones less) is recovered exactly at
    the measured widths, interpolated between them and extended beyond; a width measured cheaper than a
    narrower one (noise, a kernel switch) is lifted to the narrower one's time."""
    base = {1: 0.050, 2: 0.080, 3: 0.100, 4: 0.110, 8: 0.150}
    points = [PassTime(c, w, b + 1e-5 * c) for c in (16, 64, 256) for w, b in base.items()]
    table = fit_pass_table(points)
    assert table.widths == (1, 2, 3, 4, 8) and table.per_context == pytest.approx(1e-5, rel=1e-6)
    assert [table(0, w) for w in base] == pytest.approx(list(base.values()), rel=1e-6)
    assert table(100, 6) == pytest.approx(0.130 + 1e-3, rel=1e-6)
    assert table(0, 12) == pytest.approx(0.190, rel=1e-6)  # the last segment's slope, 0.01 per token
    dipped = [PassTime(10, 1, 0.05), PassTime(10, 2, 0.09), PassTime(10, 4, 0.07)]
    lifted = fit_pass_table(dipped)
    assert lifted(10, 4) == pytest.approx(lifted(10, 2)) and lifted(10, 3) >= lifted(10, 2) - 1e-12
    model = LatencyModel(table, table)
    assert LatencyModel.from_json(json.loads(json.dumps(model.to_json()))) == model
    with pytest.raises(ValueError, match="must include 1"):
        fit_pass_table([PassTime(10, 2, 0.1)])
    with pytest.raises(ValueError, match="non-decreasing"):
        PassTimeTable((1, 2), (0.2, 0.1), 0.0)


def test_json_cache_is_keyed_and_refreshable(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "latency.json")
    calls: list[int] = []

    def measure() -> LatencyModel:
        calls.append(1)
        return LatencyModel(PassTimeFit(0.001 * len(calls), 0.0, 0.0), PassTimeFit(0.01, 0.001, 0.0), law_per_row=0.006)

    key = cache_key("target", "draft", "float32")
    assert "float32" in key and "threads=" in key
    first = load_or_measure(path, key, measure)
    again = load_or_measure(path, key, measure)
    assert len(calls) == 1 and again == first and again.key == key and again.law_per_row == 0.006
    other = load_or_measure(path, key + "x", measure)
    assert len(calls) == 2 and other.draft.intercept == pytest.approx(0.002)
    refreshed = load_or_measure(path, key, measure, refresh=True)
    assert len(calls) == 3 and refreshed.draft.intercept == pytest.approx(0.003)
    with open(path, encoding="utf-8") as handle:
        assert set(json.load(handle)) == {key, key + "x"}
