"""BV's correction after a partial acceptance (0 < tau < L) comes from the *weighted* residual
Res(w_tau p_tau, q_tau) (docs/algorithms.md section 5.2). The seeded tables of the losslessness tests never
make w_tau < 1 change the residual's shape, so Res(p_tau, q_tau) passed them; these tables do (the lossy
variant has total variation 0.058 from the autoregressive law here)."""

from __future__ import annotations

import pytest

from tests.ref.test_verify_exact import autoregressive_law, extended_block_law, iid_tree, random_table


@pytest.mark.parametrize(("K", "L"), [(1, 2), (2, 2), (1, 3)])
@pytest.mark.parametrize("method", ["bv", "tree_mc", "traversal"])
def test_block_verifiers_are_lossless_where_the_weighted_residual_differs_from_the_plain_one(
    method: str, K: int, L: int
) -> None:
    target, draft = random_table(103, L + 1), random_table(203, L)
    law = extended_block_law(target, draft, iid_tree(K, L), L + 1, method)
    assert law == autoregressive_law(target, L + 1)
