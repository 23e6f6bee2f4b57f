"""Tree verification, the twin of :mod:`spec_ref.verify` and :mod:`spec_ref.solvers`.

- :mod:`spec_fast.verify.tree`: :func:`verify_tree` (every method of :data:`METHODS`, batched over rows),
  :func:`verify_greedy`, the uniforms layout (:func:`uniforms_per_node`, :func:`draw_uniforms`);
- :mod:`spec_fast.verify.solvers`: the per-node OT solvers of the top-down driver (naive, NSS, SpecTr,
  SpecInfer, Khisti);
- :mod:`spec_fast.verify.single_path`: the path-0 methods (naive, block verification, tree Monte Carlo);
- :mod:`spec_fast.verify.traversal`: Traversal verification;
- :mod:`spec_fast.verify.otlp`: the five OTLP solvers as token-level kernels (sample, branching,
  acceptance), the twins of :mod:`spec_ref.solvers`' laws.

This package sits on the ground floor of the engine (docs/engine.md, "Layout"): it imports nothing of the
drafts or the engine.
"""

from __future__ import annotations

from spec_fast.verify.otlp import SOLVER_NAMES, solver_acceptance, solver_branching, solver_sample
from spec_fast.verify.tree import (
    METHODS, TreeVerifyOutput, Verified, child_slots, draw_uniforms, path_zero_slots, uniforms_per_node,
    verify_greedy, verify_tree,
)

__all__ = ["METHODS", "TreeVerifyOutput", "Verified", "verify_tree", "verify_greedy", "uniforms_per_node",
           "draw_uniforms", "child_slots", "path_zero_slots", "SOLVER_NAMES", "solver_sample", "solver_branching",
           "solver_acceptance"]
