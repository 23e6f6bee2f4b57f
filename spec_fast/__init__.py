"""spec_fast: the batched torch engine for multi-path speculative decoding (GPU first, runs on CPU).

With the same uniforms it returns exactly the tokens of :mod:`spec_ref`; greedy speculative output is
byte-identical to greedy autoregressive output in float32.
"""

from spec_fast.flat_tree import FlatTree

__all__ = ["FlatTree"]
# --- further exports are added below this line ---
