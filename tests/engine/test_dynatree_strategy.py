"""The DynaTree strategy string and :meth:`Strategy.for_dynatree` carry every DynaTree parameter
(spec_fast/strategies.py module docstring) to :class:`spec_ref.dynatree.DynaTreeParams` and the history
window, and refuse a bad value with an error naming it. No model is run: parsing only."""

from __future__ import annotations

from dataclasses import fields

import pytest

from spec_fast.settings import SettingError, resolve_settings
from spec_fast.strategies import Strategy, parse_strategy
from spec_ref.dynatree import DynaTreeParams

NON_DEFAULT = dict(
    branch_min=2, branch_mid=3, branch_max=5, tau_low=0.25, tau_high=0.75, base_depth=3, max_depth=7,
    rho_stop=0.02, rho_deep=0.4, prune_threshold=0.01, node_budget=40, high_acceptance=0.7,
    low_acceptance=0.2, threshold_step=0.1, depth_step=2,
)


def test_every_parameter_of_the_keyword_form_reaches_dynatree_params_and_the_window() -> None:
    assert set(NON_DEFAULT) == {f.name for f in fields(DynaTreeParams)}  # the test covers every field
    spec = "dynatree:" + ",".join(f"{k}={v}" for k, v in NON_DEFAULT.items()) + ",window=6"
    strategy = parse_strategy(spec)
    assert strategy.dynatree_params() == DynaTreeParams(**NON_DEFAULT)  # type: ignore[arg-type]
    assert strategy.dynatree_window == 6
    assert strategy.max_nodes == 1 + 40 and strategy.depth == 8 and strategy.verifier == "nss"
    # the Python form builds the same strategy, and equal parameters give equal (hashable) strategies
    assert Strategy.for_dynatree(DynaTreeParams(**NON_DEFAULT), window=6) == strategy  # type: ignore[arg-type]
    assert hash(strategy) == hash(Strategy.for_dynatree(DynaTreeParams(**NON_DEFAULT), window=6))  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["dynatree", "dynatree:5,8,64", "dynatree:d0=5,dmax=8,budget=64",
                                  "dynatree:tau_high=0.9,tau_low=0.4,window=4"])
def test_the_positional_keyword_and_default_forms_agree(spec: str) -> None:
    strategy = parse_strategy(spec)
    assert strategy == parse_strategy("dynatree")
    assert strategy.dynatree_params() == DynaTreeParams() and strategy.dynatree_window == 4


def test_positional_numbers_then_keywords_and_aliases() -> None:
    strategy = parse_strategy("dynatree:2,4,10,prune=0.02,tau_high=0.8+adaptive")
    params = strategy.dynatree_params()
    assert (params.base_depth, params.max_depth, params.node_budget) == (2, 4, 10)
    assert (params.prune_threshold, params.tau_high, params.tau_low) == (0.02, 0.8, 0.4)
    assert strategy.adaptive and strategy.label() == "dynatree:2,4,10,prune_threshold=0.02,tau_high=0.8/nss+adaptive"


@pytest.mark.parametrize("spec,match", [
    ("dynatree:tau_high=1.2", "tau_high=1.2"),
    ("dynatree:tau_low=0.5,tau_high=0.4", "tau_low=0.5"),
    ("dynatree:prune=0", "prune_threshold"),
    ("dynatree:prune=1.5", "prune_threshold"),
    ("dynatree:rho_stop=0.5,rho_deep=0.4", "rho_stop"),
    ("dynatree:branch_min=3,branch_mid=2", "branch_min"),
    ("dynatree:branch_max=0", "branch"),
    ("dynatree:branch_min=1.5", "branch_min must be an integer"),
    ("dynatree:window=0", "window"),
    ("dynatree:window=two", "window must be an integer"),
    ("dynatree:tau_high=x", "tau_high must be a number"),
    ("dynatree:tau_high=nan", "tau_high"),
    ("dynatree:low_acceptance=0.9", "low_acceptance"),
    ("dynatree:threshold_step=0.5", "threshold_step"),
    ("dynatree:depth_step=-1", "depth_step"),
    ("dynatree:d0=3,base_depth=3", "base_depth given twice"),
    ("dynatree:d0=4,dmax=4", "D0 < DMAX"),
    ("dynatree:budget=0", "node_budget"),
    ("dynatree:tau_hi=0.3", "unknown DynaTree parameter 'tau_hi'"),
    ("dynatree:5,8", "three integers"),
    ("dynatree:tau_high=0.8,5,8,64", "three integers"),
])
def test_bad_dynatree_values_are_refused_naming_the_parameter(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_strategy(spec)


def test_the_api_settings_accept_and_check_the_keyword_form() -> None:
    settings = resolve_settings(draft="early-exit:2", strategy="dynatree:3,6,20,tau_low=0.3,window=2")
    assert settings.strategy.dynatree_params().tau_low == 0.3 and settings.strategy.dynatree_window == 2
    with pytest.raises(SettingError, match="tau_low"):
        resolve_settings(draft="early-exit:2", strategy="dynatree:tau_low=0.95")


def test_for_dynatree_and_options_on_other_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="DynaTreeParams"):
        Strategy.for_dynatree({"tau_high": 0.8})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        Strategy.for_dynatree(DynaTreeParams(), window=0)
    with pytest.raises(ValueError, match="shape 'dynatree'"):
        Strategy(shape="chain", depth=2, dynatree_options=(("tau_high", 0.8),))
