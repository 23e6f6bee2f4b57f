"""The committed selector (spec_fast/weights/selector.safetensors) against the committed dataset
(bench/data/selector_dataset.npz): it was trained on that file, and on its held-out roots it picks what
bench/results/selector_train.md and the README report: the best static action of the training roots at every
held-out root (on the lean forward with the native products that is the one-token tree (1, 0, 1); the eq. 10
network did not learn which roots deserve another action, bench/results/selector_cv.md). Control: a crafted net
whose policy follows the draft's entropy at the root does pick more than one tree on the same roots."""

from __future__ import annotations

import json
import os

import pytest
import torch

from spec_fast.nde import DEFAULT_SELECTOR_WEIGHTS
from spec_fast.nde.selector import SCALAR_FEATURES, RootFeatures, SelectorNet, tree_key
from spec_fast.nde.selector_training import best_static_action, load_dataset, load_selector, split_by_prompt

DATASET = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "data", "selector_dataset.npz")


@pytest.fixture(scope="module")
def committed() -> tuple[SelectorNet, dict[str, str], object]:
    if not (os.path.exists(DATASET) and os.path.exists(DEFAULT_SELECTOR_WEIGHTS)):
        pytest.skip("no committed dataset or weights")
    net, metadata = load_selector(DEFAULT_SELECTOR_WEIGHTS)
    return net, metadata, load_dataset(DATASET)


def test_the_weights_were_trained_on_the_committed_dataset(committed: tuple[SelectorNet, dict[str, str], object]) -> None:
    net, metadata, data = committed
    assert json.loads(metadata["dataset_header"]) == data.header  # type: ignore[attr-defined]
    assert net.config.actions == data.actions  # type: ignore[attr-defined]


def test_the_committed_policy_picks_the_best_static_action_on_held_out_roots(
        committed: tuple[SelectorNet, dict[str, str], object]) -> None:
    net, _, data = committed
    train, held = split_by_prompt(data)  # type: ignore[arg-type]
    static = data.actions[best_static_action(data, train)]  # type: ignore[arg-type, attr-defined]
    assert tree_key(static) == (1, 1)  # the one-token tree, as bench/results/selector_train.md reports
    with torch.no_grad():
        picks = net.select(data.features(held))  # type: ignore[attr-defined]
    trees = {tree_key(data.actions[int(a)]) for a in picks.tolist()}  # type: ignore[attr-defined]
    assert trees == {tree_key(static)}

    class EntropyRule(SelectorNet):
        """Control: the chain of one token where the draft is sure at the root, else the plain step."""

        def forward(self, features: RootFeatures) -> torch.Tensor:
            sure = features.scalars[:, SCALAR_FEATURES.index("entropy_q_root")] < 0.5
            logits = torch.full((features.batch_size, self.config.num_actions), -30.0)
            logits[:, self.config.actions.index((1, 0, 0))] = 0.0
            logits[:, self.config.actions.index((1, 0, 1))] = torch.where(sure, 10.0, -10.0)
            return logits

    control = EntropyRule(net.config).eval()
    with torch.no_grad():
        chosen = control.select(data.features(held))  # type: ignore[attr-defined]
    assert {tree_key(data.actions[int(a)]) for a in chosen.tolist()} == {(1, 0), (1, 1)}  # type: ignore[attr-defined]
