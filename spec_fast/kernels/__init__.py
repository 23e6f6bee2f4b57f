"""Token-level kernels: the five OTLP solvers batched over rows (sample, branching, acceptance)."""

from spec_fast.kernels.otlp import SOLVER_NAMES, solver_acceptance, solver_branching, solver_sample

__all__ = ["SOLVER_NAMES", "solver_sample", "solver_branching", "solver_acceptance"]
