"""spec_ref: the exact, float64 NumPy/SciPy reference for multi-path speculative decoding.

Pure functions, randomness passed in through one small protocol (:mod:`spec_ref.rng`), frozen results,
``ValueError`` naming the bad argument. The same code runs in exact rational arithmetic when given
``fractions.Fraction`` probabilities, which is how :func:`exact_law` proves laws with ``==``.
No torch import anywhere in this package.
"""

from spec_ref.decoding import decoding_operator, greedy_token, validate_sampling_params
from spec_ref.rng import (
    ExactLaw,
    GeneratorSource,
    NodeReplaySource,
    RandomSource,
    ReplaySource,
    as_source,
    exact_law,
)
from spec_ref.solvers import (
    SOLVERS,
    KhistiSolver,
    NaiveSolver,
    NSSSolver,
    Solver,
    SolverPlan,
    SpecInferSolver,
    SpecTrSolver,
    accept_probability,
    acceptance_by_enumeration,
    rho_star,
)
from spec_ref._sampling import accept, inverse_cdf, residual

__all__ = [
    "decoding_operator",
    "greedy_token",
    "validate_sampling_params",
    "ExactLaw",
    "GeneratorSource",
    "NodeReplaySource",
    "RandomSource",
    "ReplaySource",
    "as_source",
    "exact_law",
    "SOLVERS",
    "Solver",
    "SolverPlan",
    "NSSSolver",
    "NaiveSolver",
    "SpecTrSolver",
    "SpecInferSolver",
    "KhistiSolver",
    "accept_probability",
    "acceptance_by_enumeration",
    "rho_star",
    "accept",
    "inverse_cdf",
    "residual",
]
from spec_ref.tree import PROCESSES, DraftTree, Model

__all__ += ["DraftTree", "Model", "PROCESSES"]
# --- tree-level API (issue 3) is re-exported below this line ---
from spec_ref.verify import METHODS, VerifyResult, verify

__all__ += ["METHODS", "VerifyResult", "verify"]
from spec_ref.efficiency import (
    accepted_depth_law,
    estimate_block_efficiency,
    exact_block_efficiency,
    expected_block_efficiency,
)

__all__ += [
    "accepted_depth_law",
    "estimate_block_efficiency",
    "exact_block_efficiency",
    "expected_block_efficiency",
]
# issue 3 part B: drafting, tensorisation, dual draft, DynaTree, NDE selector math
from spec_ref.drafting import ScoredDraftTree, draft_delayed_tree, draft_iid_tree, draft_topk_tree
from spec_ref.tensorize import TensorizedTree, tensorize, tensorize_structure
from spec_ref.dual import (
    MergedGreedyResult,
    MergedTree,
    RouteResult,
    RouteCalibration,
    CalibratedRouteResult,
    calibrated_route,
    update_calibration,
    mean_confidence,
    mean_tokens_per_step,
    merge_trees,
    route,
    tokens_per_step,
    verify_merged_greedy,
)
from spec_ref.dynatree import DynaTreeHistory, DynaTreeParams, adjusted_params, draft_dynatree, update_history
from spec_ref import selector

__all__ += [
    "ScoredDraftTree",
    "draft_delayed_tree",
    "draft_iid_tree",
    "draft_topk_tree",
    "TensorizedTree",
    "tensorize",
    "tensorize_structure",
    "MergedTree",
    "MergedGreedyResult",
    "RouteResult",
    "RouteCalibration",
    "CalibratedRouteResult",
    "calibrated_route",
    "update_calibration",
    "merge_trees",
    "route",
    "mean_confidence",
    "tokens_per_step",
    "mean_tokens_per_step",
    "verify_merged_greedy",
    "DynaTreeParams",
    "DynaTreeHistory",
    "draft_dynatree",
    "update_history",
    "adjusted_params",
    "selector",
]
