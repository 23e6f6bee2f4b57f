"""Mutation check: apply each catalogued lossy or wrong variant to a temporary copy of the repository, one at a
time, and run the tests that should catch it (docs/testing.md section 7).

Every mutant is an exact text patch ``(old -> new)`` of one source file: ``old`` must occur exactly once in
the current source (``--check`` verifies that without running anything; a CI test runs it so the catalogue
cannot rot). A mutant is *killed* when its tests fail (pytest exit status 1); anything else is reported:
``survived`` (tests pass), ``timeout``, ``error`` (collection/import error, exit status 2-4).

Before any mutant runs, the union of the chosen mutants' tests must pass on the unmutated copy: a test that
already fails would count every mutant it guards as killed, so the script refuses (exit status 2) and names
the failing tests instead. The report names the commit it ran on.

The test-side negative controls in ``tests/ref/mutants.py`` (solver subclasses fed to the exact and
statistical checks) complement this catalogue: those prove a check *can* fail, these prove the product code
is pinned by the suite.

    PYTHONPATH=$PWD python scripts/mutants.py            # full catalogue -> bench/results/mutants.{json,md}
    PYTHONPATH=$PWD python scripts/mutants.py --fast     # the quick subset (a few minutes)
    PYTHONPATH=$PWD python scripts/mutants.py --check    # only check that every patch applies
    PYTHONPATH=$PWD python scripts/mutants.py --only NAME[,NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # file relative to the repository root
    edits: tuple[tuple[str, str], ...]  # (old, new); each old occurs exactly once
    tests: tuple[str, ...]  # pytest arguments (files, node ids, -k expressions)
    why: str
    fast: bool = False


def _m(name: str, path: str, old: str, new: str, tests: tuple[str, ...], why: str, fast: bool = False) -> Mutant:
    return Mutant(name, path, ((old, new),), tests, why, fast)


REF_VERIFY = ("tests/ref/test_verify_exact.py",)
REF_SOLVERS = ("tests/ref/test_solvers_exact.py", "tests/ref/test_rng_and_inputs.py")
PARITY = ("tests/fast/test_kernels_parity.py", "tests/fast/test_traversal_rejections.py")

CATALOGUE: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ spec_ref sampling primitives
    _m("accept-non-strict", "spec_ref/_sampling.py",
       "return bool(u * draft_mass < target_mass)", "return bool(u * draft_mass <= target_mass)",
       ("tests/ref/test_rng_and_inputs.py",), "u = 0 accepts a token of zero target mass", fast=True),
    _m("residual-uniform-fallback", "spec_ref/_sampling.py",
       "    return a / a.sum()  # type: ignore[no-any-return]",
       "    return np.ones_like(a) / a.shape[0]  # type: ignore[no-any-return]",
       ("tests/ref/test_rng_and_inputs.py",), "zero residual mass falls back to uniform, not to p"),
    _m("inverse-cdf-left", "spec_ref/_sampling.py", 'side="right"', 'side="left"',
       ("tests/ref/test_rng_and_inputs.py", "tests/fast/test_kernels_parity.py"),
       "inverse CDF can return a zero-weight index"),
    # ------------------------------------------------------------------ spec_ref solvers
    _m("naive-resample-from-p", "spec_ref/solvers.py",
       "        if accept(rng.uniform(), q[first], p[first]):\n            return first\n        return rng.categorical(residual(p, q))",
       "        if accept(rng.uniform(), q[first], p[first]):\n            return first\n        return rng.categorical(p)",
       REF_SOLVERS, "on rejection resample from p instead of (p - q)+"),
    _m("spectr-rho-one", "spec_ref/solvers.py",
       "        rho = rho_star(target, draft, k, self.iterations)\n",
       "        rho = target.sum() / target.sum()\n", REF_SOLVERS, "SpecTr with rho = 1"),
    _m("spectr-rho-lower-bracket", "spec_ref/solvers.py", "    return hi  # type: ignore[no-any-return]",
       "    return lo  # type: ignore[no-any-return]", REF_SOLVERS, "SpecTr rho from the infeasible bracket end"),
    _m("spectr-no-beta-guard", "spec_ref/solvers.py",
       "gamma = accept_all / beta if beta > 0 else rho", "gamma = accept_all / beta",
       REF_SOLVERS, "SpecTr 0/0 on disjoint supports"),
    _m("specinfer-no-residual-update", "spec_ref/solvers.py",
       "            chain.append(residual(chain[-1], draft))", "            chain.append(chain[-1])",
       REF_SOLVERS, "SpecInfer tests every draw against p"),
    _m("khisti-keep-not-complemented", "spec_ref/solvers.py",
       "return self.keep[a, b] if a < b else one - self.keep[a, b]",
       "return self.keep[a, b] if a < b else self.keep[a, b]",
       REF_SOLVERS, "Khisti: the second draw of a pair kept with the first's probability"),
    # ------------------------------------------------------------------ spec_ref tree verifiers
    _m("naive-tree-residual-is-p", "spec_ref/verify.py",
       "            return parent, stream.categorical(residual(p, q))",
       "            return parent, stream.categorical(p)", REF_VERIFY, "OT driver correction drawn from p"),
    _m("bv-denominator-without-weight", "spec_ref/verify.py",
       "        d = z + (one - weights[i])", "        d = z + one", REF_VERIFY, "BV h_i = Z/(Z+1) instead of Z/(Z+1-w)"),
    _m("bv-residual-unweighted", "spec_ref/verify.py",
       "residual(weights[tau] * probs.target[node], _path_q(probs, node))",
       "residual(probs.target[node], _path_q(probs, node))", ("tests/ref/test_weighted_residuals.py", *REF_VERIFY),
       "BV correction from Res(p, q)"),
    _m("tree-mc-no-rescale", "spec_ref/verify.py",
       "scale = (one - s_j) / excess if excess > 0 else one", "scale = one",
       REF_VERIFY, "tree verification without the t_j rescaling of earlier rows"),
    _m("traversal-mass-without-weight", "spec_ref/verify.py",
       "        mass = positive_part(weight[u] * current_target[u] - q)",
       "        mass = positive_part(current_target[u] - q)", REF_VERIFY, "Traversal residual ignores w_u"),
    _m("capped-ratio-inverted", "spec_ref/verify.py",
       "return one if numerator >= denominator else numerator / denominator",
       "return one if numerator >= denominator else numerator / (denominator + denominator)",
       REF_VERIFY, "path weights halved below 1"),
    # ------------------------------------------------------------------ spec_ref decoding operator
    _m("top-k-drops-ties", "spec_ref/decoding.py",
       "z = np.where(z < kth_largest, -np.inf, z)", "z = np.where(z <= kth_largest, -np.inf, z)",
       ("tests/ref/test_decoding.py",), "top-k drops the k-th largest and its ties"),
    _m("top-p-non-strict", "spec_ref/decoding.py",
       "keep_sorted = mass_before < float(top_p)", "keep_sorted = mass_before <= float(top_p)",
       ("tests/ref/test_decoding.py",), "top-p keeps one token too many at an exact boundary"),
    # ------------------------------------------------------------------ spec_ref tensorisation, dual heads, DynaTree
    _m("position-id-is-slot", "spec_ref/tensorize.py",
       "        positions[i] = positions[parent] + 1", "        positions[i] = i",
       ("tests/ref/test_tensorize.py",), "position ids by slot instead of depth"),
    _m("mask-without-self", "spec_ref/tensorize.py",
       "        mask[i, i] = True", "        mask[i, i] = False",
       ("tests/ref/test_tensorize.py",), "a node does not attend to itself"),
    _m("route-ties-to-head-two", "spec_ref/dual.py", "    if mu_a >= mu_b:", "    if mu_a > mu_b:",
       ("tests/ref/test_dual.py",), "routing ties go to head 2"),
    _m("route-score-sum", "spec_ref/dual.py", "    return total / len(scores)", "    return total",
       ("tests/ref/test_dual.py",), "routing score is the sum, not the mean, of confidences"),
    _m("merged-argmax-highest-id", "spec_ref/dual.py",
       "        if probs[t] > probs[best]:", "        if probs[t] >= probs[best]:",
       ("tests/ref/test_dual.py", "tests/ref/test_verify_greedy_and_errors.py"), "greedy ties to the highest id"),
    _m("merged-longest-ties-to-head-two", "spec_ref/dual.py",
       "                if length + 1 > best[0]:", "                if length + 1 >= best[0]:",
       ("tests/ref/test_dual.py",), "equal matches go to the later head"),
    _m("dynatree-branch-threshold-strict", "spec_ref/dynatree.py",
       "    if confidence >= params.tau_high:", "    if confidence > params.tau_high:",
       ("tests/ref/test_dynatree.py",), "confidence at tau_high takes the lower branch count"),
    _m("dynatree-no-depth-limit", "spec_ref/dynatree.py",
       "or depth >= params.max_depth or", "or depth > params.max_depth or",
       ("tests/ref/test_dynatree.py",), "DynaTree expands one level past max_depth"),
    # ------------------------------------------------------------------ spec_fast verification kernels
    _m("fast-traversal-old-weight-after-reject", "spec_fast/verify/traversal.py",
       "        weight[sel, lev] = torch.where(apply, updated, weight[sel, lev])",
       "        weight[sel, lev] = torch.where(apply, w, weight[sel, lev])",
       PARITY, "Traversal keeps the old node weight after a REJECT", fast=True),
    Mutant("fast-inverse-cdf-float32-single-level", "spec_fast/_sampling.py", (
        ("    if vocab < _CHUNKED_CDF_MIN_VOCAB:\n", "    if True:\n"),
        ("        cumulative = torch.cumsum(weights, dim=1, dtype=F64)  # [R, V]",
         "        cumulative = torch.cumsum(weights, dim=1).to(F64)  # [R, V]"),
    ), ("tests/fast/test_inverse_cdf_large_vocab.py",), "one float32 cumulative sum at V = 151936", fast=True),
    _m("fast-inverse-cdf-float32-chunk-totals", "spec_fast/_sampling.py",
       "reshape(rows, full, size).sum(dim=2, dtype=F64)]", "reshape(rows, full, size).sum(dim=2).to(F64)]",
       ("tests/fast/test_inverse_cdf_large_vocab.py",), "float32 chunk totals in the two-level inverse CDF"),
    _m("fast-residual-uniform-fallback", "spec_fast/_sampling.py",
       "    return mass.addcmul_(base, empty)", "    return mass.add_(empty / base.shape[1])",
       ("tests/fast/test_bad_values.py", *PARITY), "zero residual mass falls back to uniform"),
    _m("fast-naive-accept-non-strict", "spec_fast/verify/solvers.py",
       "    accepted = ~leaf & (u0 * q_x < p_x)", "    accepted = ~leaf & (u0 * q_x <= p_x)",
       PARITY, "u = 0 accepts a zero-mass draft (naive)"),
    _m("fast-bv-denominator-without-weight", "spec_fast/verify/single_path.py",
       "        d = z + (1 - w_i)", "        d = z + 1", PARITY, "BV h_i = Z/(Z+1)"),
    _m("fast-inverse-cdf-no-clamp", "spec_fast/_sampling.py",
       "        return torch.minimum(index, last_positive).squeeze(1).clamp_(0, vocab - 1)",
       "        return index.squeeze(1)", ("tests/fast/test_inverse_cdf_large_vocab.py",),
       "no guard: id V on NaN rows, zero-weight ids on rounding"),
    _m("fast-specinfer-no-residual-update", "spec_fast/verify/solvers.py",
       "current = torch.where(advance, _normalised_residual(current, draft64), current)",
       "current = torch.where(advance, current, current)", PARITY, "SpecInfer tests every draw against p"),
    _m("fast-spectr-rho-one", "spec_fast/verify/solvers.py",
       "        rho = _rho_star(node.target, node.draft, count, iterations)",
       "        rho = torch.ones_like(_rho_star(node.target, node.draft, count, iterations))", PARITY,
       "SpecTr with rho = 1 (device path)"),
    # ------------------------------------------------------------------ spec_fast decoding operator
    _m("fast-top-k-drops-ties", "spec_fast/decoding.py",
       "keep_sorted = sorted_logits >= threshold", "keep_sorted = sorted_logits > threshold",
       ("tests/fast/test_decoding_operator.py",), "top-k drops the ties at the threshold"),
    _m("fast-decoding-unshifted", "spec_fast/decoding.py",
       "keep_sorted, (sorted_logits - row_max) / safe_t,", "keep_sorted, sorted_logits / safe_t,",
       ("tests/fast/test_bad_values.py",), "logits / 1e-38 overflows to a NaN softmax"),
    # ------------------------------------------------------------------ engine: tree attention, KV cache, drafting
    _m("mask-entry-without-self", "spec_fast/tree_attention.py",
       "    reach[:, new, new] = 1.0", "    reach[:, new, new] = 0.0",
       ("tests/engine/test_tree_attention_and_cache.py",), "a block entry does not attend to itself"),
    _m("ancestors-one-doubling-short", "spec_fast/tree_attention.py",
       "    for _ in range(max(1, (total - 1).bit_length())):",
       "    for _ in range(max(1, (total - 1).bit_length() - 1)):",
       ("tests/engine/test_tree_attention_and_cache.py",),
       "the ancestor relation stops one doubling short: deep entries miss their farthest ancestors"),
    _m("position-id-off-by-one", "spec_fast/kv_cache.py",
       "depths = self.ancestors[:, -num_query:, :].sum(dim=-1) - 1",
       "depths = self.ancestors[:, -num_query:, :].sum(dim=-1)",
       ("tests/engine/test_tree_attention_and_cache.py",), "tree nodes one position too far"),
    _m("kv-gather-index-off-by-one", "spec_fast/kv_cache.py",
       "block_src = torch.gather(keep, 1, offset.clamp(0, keep.shape[1] - 1))",
       "block_src = torch.gather(keep, 1, (offset + 1).clamp(0, keep.shape[1] - 1))",
       ("tests/engine/test_tree_attention_and_cache.py",), "commit gathers the next block entry's KV"),
    _m("kv-move-kept-order-reversed", "spec_fast/kv_cache.py",
       "        target = self.lengths.unsqueeze(1) + index\n",
       "        target = self.lengths.unsqueeze(1) + index.flip(1)\n",
       ("tests/engine/test_tree_attention_and_cache.py",), "a ragged commit writes the kept entries in reverse order"),
    _m("engine-dynatree-ties-to-highest-id", "spec_fast/drafts/dynatree.py",
       "        top_vals, top_ids = ranked_tokens(q, min(bmax, q.shape[-1]))",
       "        top_vals, top_ids = torch.topk(q.flip(-1), min(bmax, q.shape[-1]), dim=-1)\n"
       "        top_ids = q.shape[-1] - 1 - top_ids",
       ("tests/engine/test_drafting_decisions.py::test_dynatree_trees_with_ties_equal_the_reference_rule",),
       "DynaTree branching takes tied children highest id first", fast=True),
    # ------------------------------------------------------------------ native matrix products (spec_fast/lean)
    _m("native-block-offset-subtracted", "spec_fast/lean/blocks.c",
       "_mm512_fmadd_ps(mc, shift, acc));",
       "_mm512_fnmadd_ps(mc, shift, acc));",
       ("tests/engine/test_lean.py::test_block_quantised_products_use_the_stored_weights_and_each_row_ignores_the_others",),
       "block weights decoded as d q - m instead of the file's d q + m (Q4_1; Q8_0's stored bias added, not removed)"),
    _m("native-f32-last-input-dropped", "spec_fast/lean/kernels.c",
       "    for (int64_t k = 0; k < k_size; ++k) {\n        f32x16 wk[VECS];",
       "    for (int64_t k = 0; k < k_size - 1; ++k) {\n        f32x16 wk[VECS];",
       ("tests/engine/test_lean.py::test_the_native_float32_product_is_the_product_and_each_row_ignores_the_others",),
       "the float32 product skips the last input of every output"),
    _m("native-f32-rows-depend-on-the-batch", "spec_fast/lean/kernels.c",
       "            const float xv = x[r * ldx + k];\n            for (int c = 0; c < VECS; ++c) acc[r][c] += xv * wk[c];",
       "            const float xv = x[r * ldx + k] * (rows > 1 ? 1.0000001f : 1.0f);\n"
       "            for (int c = 0; c < VECS; ++c) acc[r][c] += xv * wk[c];",
       ("tests/engine/test_lean.py::test_the_native_float32_product_is_the_product_and_each_row_ignores_the_others",),
       "a row's product changes in its last bits when other rows share the pass (within float tolerance, "
       "so only the exact batch-invariance check can see it)"),
    _m("native-activations-truncated", "spec_fast/lean/blocks.c",
       "_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC", "_MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC",
       ("tests/engine/test_lean.py::test_block_quantised_products_use_the_stored_weights_and_each_row_ignores_the_others",),
       "activations quantised to int8 by truncation instead of llama.cpp's round-to-nearest"),
    _m("native-activation-scale-128", "spec_fast/lean/blocks.c",
       "const float d = amax / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;\n            const __m512 scale",
       "const float d = amax / 128.f, inverse = d > 0.f ? 1.f / d : 0.f;\n            const __m512 scale",
       ("tests/engine/test_lean.py::test_block_quantised_products_use_the_stored_weights_and_each_row_ignores_the_others",),
       "activation groups scaled to +-128 instead of +-127"),
    _m("lean-layer-stack-kept-across-new-buffers", "spec_fast/lean/cache.py",
       "                new is not old for call, then in zip(calls, kept.layers) for new, old in zip(call, then)):",
       "                new is not old for call, then in zip(calls, kept.layers) for new, old in zip(call[:1], then)):",
       ("tests/engine/test_lean_layer.py::test_a_cache_keeps_its_checked_layer_stack_while_its_buffers_and_weights_stay",),
       "a pass reuses the cache's checked layer stack after its buffers grew (only the weights compared): the "
       "layers would read and write the old buffers"),
    _m("lean-kept-stack-ignores-changes", "spec_fast/lean/cache.py",
       "        if kept is None or checked is None or checked[0] != watch.changes() or kept.batch != batch:",
       "        if kept is None or checked is None or kept.batch != batch:",
       ("tests/engine/test_lean_layer.py::test_passes_reuse_the_kept_stack_unchecked_until_a_module_or_buffer_changes",),
       "a pass takes the kept layer stack after a module changed: a replaced norm weight is read from the old one"),
    _m("lean-kept-stack-ignores-replaced-layers", "spec_fast/lean/cache.py",
       "        return kept if all(a is b for a, b in zip(checked[1], layers)) else None",
       "        return kept",
       ("tests/engine/test_lean_layer.py::test_passes_reuse_the_kept_stack_unchecked_until_a_module_or_buffer_changes",),
       "a layer replaced in the model's layer list (which counts no change) runs with the old layer's weights"),
    _m("lean-native-weights-keyed-by-id-only", "spec_fast/lean/model.py",
       "        key = tuple((id(t), None if t is None else t.data_ptr()) for t in tensors)",
       "        key = tuple(map(id, tensors))",
       ("tests/engine/test_lean_layer.py::test_passes_reuse_the_kept_stack_unchecked_until_a_module_or_buffer_changes",),
       "a weight given new storage under the same tensor object keeps a struct that points at the freed storage"),
    _m("lean-cache-buffers-kept-across-new-buffers", "spec_fast/lean/cache.py",
       "        if kept is None or len(kept) != len(buffers) or any(",
       "        if kept is None or len(kept) != len(buffers) or False and any(",
       ("tests/engine/test_tree_attention_and_cache.py::"
        "test_the_lean_cache_checks_its_buffers_for_a_move_once_and_again_when_they_are_replaced",),
       "a ragged commit's native move keeps the pointers of the cache's first buffers after they were replaced: "
       "it moves entries in the old buffers"),
    _m("lean-join-leaves-padding-unwritten", "spec_fast/lean/cache.py",
       "        if their_length < length:\n", "        if False:\n",
       ("tests/engine/test_lean_cache_rows.py::test_a_joining_row_lands_in_a_spare_row_with_its_padding_zeroed",
        "tests/engine/test_batch_engine.py::test_the_lean_cache_never_reads_a_slot_before_writing_it"),
       "a request joining a running batch keeps whatever its spare row held past its prompt: an attention that "
       "does not skip masked slots multiplies NaN by zero"),
    _m("lean-departure-moves-rows-in-any-order", "spec_fast/lean/cache.py",
       "        if all(b not in destinations for _, b in moves) or all(",
       "        if True or all(",
       ("tests/engine/test_lean_cache_rows.py::test_take_rows_keeps_the_kept_rows_entries_in_place",),
       "a departure copies rows one by one in an order that overwrites a row before it is read"),
    _m("engine-plain-step-absorbs-and-keeps-pending", "spec_fast/engine/commit.py",
       "            seen = []\n", "            seen = list(seen)\n",
       ("tests/engine/test_batch_engine.py::test_plain_steps_hand_a_retrieval_drafter_the_committed_tokens_at_once",),
       "a plain step hands a retrieval drafter its committed tokens and keeps them pending too: the next "
       "drafted step feeds them again, so the drafter's text holds them twice"),
    _m("native-halves-high-nibbles-misread", "spec_fast/lean/blocks.c",
       "_mm512_srli_epi16(both, 4)", "_mm512_srli_epi16(both, 3)",
       ("tests/engine/test_lean.py::test_block_quantised_products_use_the_stored_weights_and_each_row_ignores_the_others",),
       "the two-sweep Q4_1 product of 3-4 rows reads the high nibbles one bit off"),
    _m("native-prefetch-helper-not-inlined", "spec_fast/lean/blocks.c",
       "static inline __attribute__((always_inline)) void prefetch_ahead(",
       "static inline void prefetch_ahead(",
       ("tests/engine/test_native_boundary.py::test_the_vector_block_products_prefetch_their_weights",),
       "the weights' prefetch helper left to GCC's inliner, which deletes its calls: every result the same, "
       "the passes slower"),
    _m("engine-prefix-reuse-keeps-the-last-token", "spec_fast/engine/prefix_cache.py",
       "        limit = len(prompt) - 1\n", "        limit = len(prompt)\n",
       ("tests/engine/test_prefix_cache.py",),
       "a prompt stored whole is reused whole: nothing is left to compute its root's logits"),
    _m("engine-prefix-load-drops-a-context-entry", "spec_fast/kv_cache.py",
       "        counts = [0 if r is None or len(r) == 0 else int(r[0][0].shape[1]) for r in rows]",
       "        counts = [0 if r is None or len(r) == 0 else int(r[0][0].shape[1]) - 1 for r in rows]",
       ("tests/engine/test_prefix_cache.py",),
       "a reused prefix is loaded one entry short (its last token is never in the context)"),
    _m("engine-plain-greedy-step-last-maximum", "spec_fast/engine/step_verify.py",
       "            return _root_only(first_max_index(target_logits[:, 0]), draft.max_depth)",
       "            return _root_only(target_logits[:, 0].flip(-1).argmax(-1).neg().add(target_logits.shape[-1] - 1),"
       " draft.max_depth)",
       ("tests/engine/test_greedy.py::test_tied_logits_give_the_lowest_token_id_in_plain_and_speculative_steps",),
       "a plain greedy step takes the last of tied maxima instead of the first"),
    _m("engine-greedy-chain-accepts-past-a-mismatch", "spec_fast/engine/commit.py",
       "            depth += 1\n",
       "            depth += 1\n        depth = sum(1 for d in range(1, slots_n) if valid[d] and row_tokens[d] == argmax[d - 1])\n",
       ("tests/engine/test_greedy.py", "tests/engine/test_chain_verify_host.py"),
       "greedy chain verification counts every matching level, also those after the first mismatch"),
    _m("drafts-greedy-chain-drafts-the-argmin", "spec_fast/drafts/chain.py",
       "            token = first_max_index(logits[:, 0])",
       "            token = logits[:, 0].argmin(dim=-1)",
       ("tests/engine/test_greedy.py::test_a_self_draft_accepts_every_token_and_stays_exact",),
       "a greedy chain drafts each level's least likely token instead of its argmax"),
    _m("drafts-retrieval-greedy-next-highest-id", "spec_fast/drafts/retrieval.py",
       "        return [int(ids[int(np.argmax(weights))]) if len(ids) else 0\n",
       "        return [int(ids[-1]) if len(ids) else 0\n",
       ("tests/drafts/test_retrieval.py",),
       "a greedy retrieval level drafts the highest matched id instead of the most frequent follower"),
    _m("chain-host-verify-reads-capped-levels", "spec_fast/engine/commit.py",
       "while depth + 1 < slots_n and valid[depth + 1] and row_tokens[depth + 1] == argmax[depth]:",
       "while depth + 1 < slots_n and row_tokens[depth + 1] == argmax[depth]:",
       ("tests/engine/test_chain_verify_host.py",),
       "a greedy chain verified on the host accepts levels past a row's depth cap"),
    _m("chain-host-draft-pending-left-aligned", "spec_fast/drafts/chain.py",
       "feed = [[0] * (width - len(p)) + [int(t) for t in p] for p in pending]",
       "feed = [[int(t) for t in p] + [0] * (width - len(p)) for p in pending]",
       ("tests/engine/test_chain_verify_host.py",),
       "a greedy chain drafted on the host feeds a short pending chain left-aligned (its root is not the last entry)"),
    _m("sampled-chain-host-residual-reads-u0", "spec_fast/engine/step_verify.py",
       "draw_uniforms.append(u0[node] if leaf else u1[node])", "draw_uniforms.append(u0[node])",
       ("tests/engine/test_sampled_chain_host.py",),
       "a sampled chain verified on the host draws a rejected row's residual with the uniform of its accept test"),
    _m("sampled-retrieval-chain-draws-uniformly", "spec_fast/drafts/chain.py",
       "pick = categorical(q, streams.uniforms(level, 1))", "pick = categorical((q > 0).float(), streams.uniforms(level, 1))",
       ("tests/engine/test_sampled_chain_host.py",),
       "a sampled retrieval level draws uniformly over its matched ids, not from the law the verifier reads"),
    _m("rng-host-hash-next-counter", "spec_fast/rng.py",
       "starts[b if len(starts) > 1 else 0] + i)", "starts[b if len(starts) > 1 else 0] + i + 1)",
       ("tests/engine/test_sampled_chain_host.py",),
       "few counters hashed on the host read each row's next counter"),
    _m("native-tempered-draw-ignores-temperature", "spec_fast/lean/kernels.c",
       "for (; i < size; ++i) w[i] = exp_nonpositive((row[i] - shift) / t);",
       "for (; i < size; ++i) w[i] = exp_nonpositive(row[i] - shift);",
       ("tests/engine/test_native_tempered_draw.py",),
       "the native sampled draw and chain verification weigh softmax(logits), whatever the temperature"),
    _m("native-tempered-draw-weighs-below-the-cutoff", "spec_fast/lean/kernels.c",
       "return z > -87.0f ? y * scale : 0.0f;", "return y * scale;",
       ("tests/engine/test_native_tempered_draw.py",),
       "the native draw's exponential is not cut below float's normal range, so a -inf logit poisons the row"),
    _m("native-chain-residual-keeps-q", "spec_fast/lean/kernels.c",
       "const float d = p - q_row[i];", "const float d = p;",
       ("tests/engine/test_native_tempered_draw.py",),
       "the native chain verification draws a rejected level's token from p, not from the residual (p - q)+"),
    _m("native-filtered-draw-keeps-a-token-past-top-p", "spec_fast/lean/kernels.c",
       "kept = i; /* >= 1: the first token's preceding mass is 0 */",
       "kept = i + 1 < count ? i + 1 : i;",
       ("tests/engine/test_native_filtered_draw.py",),
       "the native top-p cut keeps the first token whose preceding mass already reaches top_p"),
    _m("native-filtered-draw-drops-ties-of-the-kth", "spec_fast/lean/kernels.c",
       "            keys[count++] = order_key(row, i);\n    return count;",
       "            (void)0;\n    return count;",
       ("tests/engine/test_native_filtered_draw.py",),
       "the native top-k cut keeps exactly k tokens, dropping the later ties of the k-th logit that G keeps"),
    _m("native-filtered-draw-floor-too-high", "spec_fast/lean/kernels.c",
       "log((1.0 - top_p[r]) * total / (4.0 * (double)size))", "log((1.0 - top_p[r]) * total / 4.0)",
       ("tests/engine/test_native_filtered_draw.py",),
       "the native top-p floor drops tokens whose mass G still needs, not only ones it cuts whatever their order"),
    _m("native-feature-head-scores-the-first-row", "spec_fast/lean/layer.c",
       "memcpy(normed + i * hidden, features + head_rows[i] * hidden", "memcpy(normed + i * hidden, features + head_rows[0] * hidden",
       ("tests/drafts/test_recurrent_head.py",),
       "the native rnn level scores the first row asked for every row asked"),
    _m("native-feature-head-drops-the-residual", "spec_fast/lean/layer.c",
       "for (int64_t i = 0; i < rows * hidden; ++i) x[i] += normed[i];",
       "for (int64_t i = 0; i < rows * hidden; ++i) x[i] = normed[i];",
       ("tests/drafts/test_recurrent_head.py",),
       "the native rnn level replaces its input map's output by the MLP's instead of adding it"),
    _m("q8-0-quantiser-truncates", "spec_fast/lean/block_layout.py",
       "values = torch.round(groups / safe)", "values = torch.trunc(groups / safe)",
       ("tests/drafts/test_recurrent_head.py",),
       "Q8_0 quantisation truncates toward zero: errors up to a whole step"),
    _m("hybrid-host-level-takes-the-model-everywhere", "spec_fast/drafts/hybrid.py",
       "if row[-1] < self.min_match]", "if row[-1] < 1 << 30]",
       ("tests/drafts/test_recurrent_head.py",),
       "a hybrid's host-drafted level takes the model's token where retrieval's match is long enough"),
    _m("hybrid-host-threshold-strict", "spec_fast/drafts/hybrid.py",
       "if row[-1] < self.min_match]", "if row[-1] <= self.min_match]",
       ("tests/drafts/test_recurrent_head.py",),
       "a hybrid's host-drafted level gives a match of exactly min_match tokens to the model"),
    _m("path-rule-certain-levels-poison-the-path", "spec_fast/drafts/head_drafter.py",
       "path *= 1.0 if math.isnan(estimate) else estimate", "path *= estimate",
       ("tests/drafts/test_recurrent_head.py",),
       "a level without an estimate (retrieval's, behind a head) makes the path's product NaN, so no rule cuts it"),
    _m("hybrid-path-rule-reads-the-head-everywhere", "spec_fast/drafts/hybrid.py",
       "path_depth([math.nan if lengths[entry] >= self.min_match else confidences[entry]",
       "path_depth([confidences[entry]",
       ("tests/drafts/test_recurrent_head.py",),
       "a hybrid's path rule weighs the levels retrieval supplies by the head's probability"),
    _m("head-confidence-recorded-at-the-first-row", "spec_fast/drafts/head_drafter.py",
       "                    tops[row] = top", "                    tops[0] = top",
       ("tests/drafts/test_recurrent_head.py",),
       "the head's top probabilities land on the first entry, not on the entries scored"),
    _m("head-history-counts-a-prompt-without-a-pass-as-pending", "spec_fast/drafts/head_drafter.py",
       "prefill = not state.prompt_committed", "prefill = state.cache.passes == 0",
       ("tests/drafts/test_recurrent_head.py",),
       "plain steps before an rnn head's first pass hand it features it files as a prefill's (its first draft "
       "reads the prompt's first feature)"),
    _m("plain-step-drops-the-heads-features", "spec_fast/engine/plain_step.py",
       "    if st.wants_hidden:  # a trained head's", "    if False:  # a trained head's",
       ("tests/engine/test_plain_step.py",),
       "a plain step of a decoder with a trained head does not hand the head the committed root's features"),
    _m("rnn-absorb-keeps-the-prefill-flag", "spec_fast/drafts/head_drafter.py",
       "        state.prefill_observed = False\n        state.prompt_committed = True\n        state.history = [rows[-self.history :] for rows in state.history]\n\n    def chain_depths",
       "        state.prefill_observed = True\n        state.prompt_committed = True\n        state.history = [rows[-self.history :] for rows in state.history]\n\n    def chain_depths",
       ("tests/drafts/test_recurrent_head.py",),
       "an rnn head that took its prompt without a pass reads its first pending chain as a prefill chain"),
    _m("causal-pass-returns-the-unnormed-states", "spec_fast/lean/causal_pass.py",
       "position + num_query\n    return logits, first_max, normed", "position + num_query\n    return logits, first_max, x",
       ("tests/engine/test_plain_step.py",),
       "the one-call causal pass hands the residual stream, not the final normed states, to a draft head"),
    _m("plain-step-wrong-uniform", "spec_fast/engine/plain_step.py",
       "streams.uniforms((batch, 1, 1))[:, 0, 0]", "streams.uniforms((batch, 1, 2))[:, 0, 1]",
       ("tests/engine/test_plain_step.py",),
       "a sampled plain step draws with another uniform than the general step's (other tokens for a seed)"),
    _m("plain-step-commit-keeps-no-length", "spec_fast/kv_cache.py",
       "        self.lengths = self.lengths + 1\n", "        self.lengths = self.lengths + 0\n",
       ("tests/engine/test_plain_step.py",),
       "the plain step's one-call commit does not count the new entry"),
    _m("native-layers-head-skips-argmax", "spec_fast/lean/layer.c",
       "    if (first_max != NULL && rows > 0 && vocab > 0)", "    if (first_max == NULL && rows > 0 && vocab > 0)",
       ("tests/engine/test_plain_step.py",),
       "the one native call of layers and head leaves the argmax unwritten"),
    _m("fast-tempered-softmax-shift-skipped", "spec_fast/decoding.py",
       "    return torch.softmax((raw - row_max) / safe_t, dim=1)",
       "    return torch.softmax(raw / safe_t, dim=1)",
       ("tests/fast/test_decoding_operator.py",),
       "the unfiltered probabilities skip the max shift (equal in exact arithmetic, other bits in float32)"),
    _m("native-amx-high-nibbles-swapped", "spec_fast/lean/blocks.c",
       "_mm512_store_si512((void *)(out + 128), _mm512_and_si512(_mm512_srli_epi16(a, 4), low_mask));",
       "_mm512_store_si512((void *)(out + 128), _mm512_and_si512(_mm512_srli_epi16(b, 4), low_mask));",
       ("tests/engine/test_native_boundary.py::test_amx_tiles_compute_what_the_vector_products_compute",),
       "the AMX product of Q4_1 reads outputs 48-63's high nibbles for outputs 32-47"),
    _m("native-amx-float-step-lags-a-group", "spec_fast/lean/blocks.c",
       "if (g > 0) amx_group_steps(kind, rows, values - group_bytes, g - 1, groups, dx, sx, sums[(g - 1) & 1], acc);",
       "if (g > 0) amx_group_steps(kind, rows, values - group_bytes, g - 1, groups, dx, sx, sums[g & 1], acc);",
       ("tests/engine/test_native_boundary.py::test_amx_tiles_compute_what_the_vector_products_compute",),
       "the AMX product's pipelined float step scales a group's sums with the previous group's scales"),
    _m("native-group-sums-first-head-weights", "spec_fast/lean/layer.c",
       "const float w = p[h * stride + j];",
       "const float w = p[j];",
       ("tests/engine/test_lean_layer.py::test_the_native_layer_runs_and_computes_what_the_python_layer_computes",),
       "the one-sweep weighted sums of a head group weight every head's values with the first head's scores"),
    _m("native-half-cache-truncates", "spec_fast/lean/layer.c",
       "return (uint16_t)(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13));",
       "return (uint16_t)(sign | (rebased >> 13));",
       ("tests/engine/test_kv_float16.py::test_cache_entries_round_to_float16_as_torch_does",),
       "float16 cache entries rounded toward zero instead of to nearest-even"),
    _m("native-half-cache-reads-float32-offsets", "spec_fast/lean/layer.c",
       "    return (const char *)base + index * (half ? 2 : 4);",
       "    return (const char *)base + index * 4;",
       ("tests/engine/test_kv_float16.py::test_a_float16_cache_matches_the_python_layer_and_stores_float16",),
       "the float16 cache addressed with float32 strides (each head reads the wrong slots)"),
    _m("native-move-entries-drops-last", "spec_fast/lean/layer.c",
       "for (int64_t i = 0; i < counts[b]; ++i)\n                    memcpy(head + target",
       "for (int64_t i = 0; i + 1 < counts[b]; ++i)\n                    memcpy(head + target",
       ("tests/engine/test_tree_attention_and_cache.py::test_the_lean_cache_moves_kept_entries_natively_and_refuses_slots_outside_its_buffers",),
       "the lean cache's native move of a ragged commit leaves each row's last kept entry behind"),
    _m("native-layer-rotation-sign", "spec_fast/lean/layer.c",
       "        turned[i] = -x[i + half];", "        turned[i] = x[i + half];",
       ("tests/engine/test_lean_layer.py::test_the_native_layer_runs_and_computes_what_the_python_layer_computes",),
       "the native layer rotates q and k the wrong way (rotate_half without its minus sign)"),
    _m("native-stack-final-norm-without-weight", "spec_fast/lean/layer.c",
       "if (norm != NULL && count > 0) rms_norm(x, batch * num_query, weights[0]->hidden, norm, eps, normed);",
       "if (norm != NULL && count > 0) rms_norm(x, batch * num_query, weights[0]->hidden, weights[0]->norm1, eps,"
       " normed);",
       ("tests/engine/test_lean_layer.py::test_the_stack_returns_the_final_norm_that_rms_norm_computes_and_torch_agrees_with",),
       "the layer stack's final norm scales by the first layer's input norm instead of the model's final norm"),
    _m("native-first-max-last-in-block", "spec_fast/lean/kernels.c",
       "at += __builtin_ctz((unsigned)hit);", "at += 31 - __builtin_clz((unsigned)hit);",
       ("tests/engine/test_native_argmax.py",),
       "the argmax sweep takes the last of equal maxima within a 16-lane block instead of the first"),
    _m("native-layer-softmax-drops-last-slot", "spec_fast/lean/layer.c",
       "            total[h] += w;",
       "            if (j + 1 < end) total[h] += w;",
       ("tests/engine/test_lean_layer.py::test_the_native_layer_runs_and_computes_what_the_python_layer_computes",),
       "the attention's softmax normaliser leaves out the newest slot"),
    _m("native-block-scores-slot-order", "spec_fast/lean/layer.c",
       "const int64_t slot = j0 + 4 * (i % 4) + i / 4;", "const int64_t slot = j0 + i;",
       ("tests/engine/test_lean_layer.py::test_past_16_slots_a_token_gets_the_same_logits_whatever_shares_its_pass",),
       "the attention's blocks of 16 scores put each slot's score in another slot's lane"),
    _m("native-block-scores-first-row-mask", "spec_fast/lean/layer.c",
       "const float *row_mask = mask == NULL ? NULL : mask + r * slots;",
       "const float *row_mask = mask;",
       ("tests/engine/test_lean_layer.py::test_a_token_gets_the_same_logits_whatever_shares_its_pass",),
       "the shared sweep scores every query row of a tree with its first row's mask"),
    _m("native-block-scores-first-row-limit", "spec_fast/lean/layer.c",
       "const int64_t open = (row_mask == NULL ? limit + r : slots) - j0;",
       "const int64_t open = (row_mask == NULL ? limit : slots) - j0;",
       ("tests/engine/test_tree_attention_and_cache.py::test_a_chain_forwarded_as_one_equals_the_same_block_as_a_tree",),
       "without a mask the shared sweep stops every query row at the first row's causal limit"),
    Mutant("native-block-scores-mask-past-the-block", "spec_fast/lean/layer.c",
           (("        const int64_t left = slots - j0;\n", "        const int64_t left = slots - j0 + 1;\n"),
            ("const int64_t open = (row_mask == NULL ? limit + r : slots) - j0;",
             "const int64_t open = (row_mask == NULL ? limit + r : slots) - j0 + 1;")),
           ("tests/engine/test_lean_layer.py",
            "tests/engine/test_tree_attention_and_cache.py::test_a_chain_forwarded_as_one_equals_the_same_block_as_a_tree"),
           "the last block of 16 scores attends one slot past the attended slots"),
    _m("lean-final-hidden-state-layer-by-layer", "spec_fast/kv_cache.py",
       '            extra["final_hidden_state_only"] = True', '            pass',
       ("tests/engine/test_lean_layer.py::test_the_final_hidden_state_alone_comes_from_the_whole_stack_in_one_call",),
       "a draft that reads the target's features makes the lean target run one native call per layer"),
    _m("select-outputs-scales-of-the-first-row", "spec_fast/lean/block_layout.py",
       "picked_scales[:chosen] = scales.reshape(blocks * BLOCK, groups, 2).index_select(0, rows)",
       "picked_scales[:chosen] = scales.reshape(blocks * BLOCK, groups, 2)[:1].expand(chosen, groups, 2)",
       ("tests/engine/test_lean.py::test_selected_outputs_of_a_q8_0_layout_are_the_bytes_pack_blocks_writes_for_those_rows",),
       "a subset of Q8_0 outputs takes the first output's scales"),
    # ------------------------------------------------------------------ model-free drafts and token emission
    _m("retrieval-law-add-one", "spec_fast/drafts/retrieval.py",
       "torch.from_numpy(ids)] = torch.from_numpy(np.log(weights)).float()",
       "torch.from_numpy(ids)] = torch.from_numpy(np.log(weights + 1.0)).float()",
       ("tests/drafts/test_retrieval.py",), "the retrieval law is add-one smoothed counts, not the counts"),
    _m("retrieval-deep-match-strict", "spec_fast/drafts/retrieval.py",
       "while depth < len(matches) and matches[depth] >= self.deep_match:",
       "while depth < len(matches) and matches[depth] > self.deep_match:",
       ("tests/drafts/test_retrieval.py",), "a chain stops behind a match of exactly deep_match tokens"),
    _m("chain-never-ends-early", "spec_fast/drafts/chain.py",
       "    return depths is None or max(depths, default=0) >= level + 2",
       "    return depths is None or max(depths, default=0) >= level + 1",
       ("tests/drafts/test_retrieval.py",), "a chain whose rows all stopped is still drafted to the strategy's depth"),
    _m("retrieval-rejected-level-counts-as-accepted", "spec_fast/drafts/retrieval.py",
       "pair[0] += 1.0 if level < int(accepted[b]) else 0.0", "pair[0] += 1.0",
       ("tests/drafts/test_retrieval.py",), "the first rejected level of a chain is learned as accepted"),
    _m("retrieval-first-level-gate-reads-row-0", "spec_fast/drafts/retrieval.py",
       "        match = self.match_length(state, row, pending)", "        match = self.match_length(state, 0, pending)",
       ("tests/drafts/test_retrieval.py",), "the first-level gate forecasts every row from row 0's text"),
    _m("retrieval-gated-rows-keep-their-counts", "spec_fast/drafts/retrieval.py",
       "            if depth >= 1 or self.first_acceptance is not None:", "            if depth >= 1:",
       ("tests/drafts/test_retrieval.py",), "a gated row's counts never fade, so a class it gave up is never retried"),
    _m("chain-ignores-the-first-level-gate", "spec_fast/drafts/chain.py",
       "        return [cap if cap < 1 or first_level(head.state, b, head.pending[b]) else 0",
       "        return [cap if cap < 1 or first_level(head.state, b, head.pending[b]) else cap",
       ("tests/drafts/test_retrieval.py",), "a chain drafts rows whose drafter forecast a loss"),
    _m("retrieval-ties-to-the-datastore", "spec_fast/drafts/retrieval.py",
       "        if m_own >= m_data and m_own > 0:", "        if m_own > m_data and m_own > 0:",
       ("tests/drafts/test_retrieval.py",), "an own-text match as long as the datastore's loses to it"),
    _m("retrieval-own-match-always-wins", "spec_fast/drafts/retrieval.py",
       "        if m_own > 0 and m_own >= self.index.max_match:", "        if m_own > 0:",
       ("tests/drafts/test_retrieval.py",), "any own-text match skips a longer datastore match"),
    _m("pass-cost-steps-to-the-wider-width", "spec_fast/engine/batch_depth.py",
       "        if lower == upper:", "        if True:",
       ("tests/engine/test_batch_engine.py::test_the_step_cost_table_times_spaced_depths_and_draws_lines_between_them",),
       "a width between two measured ones costs the wider one's (no line between them)"),
    _m("hybrid-threshold-strict", "spec_fast/drafts/hybrid.py",
       "use = (lengths >= self.min_match)", "use = (lengths > self.min_match)",
       ("tests/drafts/test_retrieval.py",), "a match of exactly min_match tokens takes the model's law"),
    _m("engine-emits-past-eos", "spec_fast/engine/decoder.py",
       "                new_tokens[b].append(t)\n                if t in st.eos:\n                    break",
       "                new_tokens[b].append(t)\n                if t in st.eos:\n                    pass",
       ("tests/engine/test_greedy.py::test_generation_stops_at_eos_like_hf_generate",),
       "the engine keeps emitting a step's accepted tokens after EOS"),
)


def check_catalogue(root: Path = ROOT) -> list[str]:
    """Problems that keep a mutant from applying to the current source (empty when all apply)."""
    problems = []
    names = [m.name for m in CATALOGUE]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"duplicate mutant name {name}")
    for mutant in CATALOGUE:
        path = root / mutant.path
        if not path.is_file():
            problems.append(f"{mutant.name}: {mutant.path} does not exist")
            continue
        text = path.read_text()
        for old, new in mutant.edits:
            count = text.count(old)
            if count != 1:
                problems.append(f"{mutant.name}: the old text occurs {count} times in {mutant.path}: {old!r}")
            if old == new:
                problems.append(f"{mutant.name}: an edit does not change anything")
        for test in mutant.tests:
            test_path = test.split("::")[0]
            if not (root / test_path).exists():
                problems.append(f"{mutant.name}: test {test_path} does not exist")
    return problems


def apply(mutant: Mutant, root: Path) -> str:
    """Apply ``mutant`` under ``root``; returns the original text of the file (to restore it)."""
    path = root / mutant.path
    original = path.read_text()
    text = original
    for old, new in mutant.edits:
        if text.count(old) != 1:
            raise SystemExit(f"mutant {mutant.name} does not apply to {mutant.path}")
        text = text.replace(old, new)
    path.write_text(text)
    return original


def copy_repository(destination: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the working tree (what a commit would hold)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
        capture_output=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run_one(mutant: Mutant, copy: Path, timeout: float, at_commit: str) -> dict[str, object]:
    original = apply(mutant, copy)
    env = dict(os.environ, CI="true", PYTHONPATH=str(copy), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-m", "not gpu",
               *mutant.tests]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        code, output = -1, (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else str(err.stdout or "")
    finally:
        (copy / mutant.path).write_text(original)
    seconds = time.perf_counter() - start
    status = {0: "survived", 1: "killed", -1: "timeout"}.get(code, "error")
    failed = re.findall(r"^FAILED (\S+)", output, flags=re.MULTILINE)
    errors = re.findall(r"^ERROR (\S+)", output, flags=re.MULTILINE)
    if status == "error" and re.search(r"^\d+ failed\b", output, flags=re.MULTILINE):
        status = "killed"  # a test failed, then a reporting plugin raised (pytest exit status 3)
        failed = failed or re.findall(r"^_{3,} (\S+) _{3,}$", output, flags=re.MULTILINE)
    return {
        "name": mutant.name, "file": mutant.path, "why": mutant.why, "status": status, "exit_code": code,
        "killed_by": (failed or errors or [""])[0], "tests": list(mutant.tests), "seconds": round(seconds, 1),
        "commit": at_commit,
        "tail": "" if status == "killed" else output[-1500:],
    }


def baseline(copy: Path, tests: list[str], timeout: float) -> tuple[int, list[str], str]:
    """Run ``tests`` on the unmutated ``copy``: ``(pytest exit status, failing tests, output tail)``."""
    env = dict(os.environ, CI="true", PYTHONPATH=str(copy), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", "-m", "not gpu", *tests]
    try:
        proc = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, [], f"timed out after {timeout:.0f} s"
    output = proc.stdout + proc.stderr
    failing = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)
    return proc.returncode, failing, output[-1500:]


def union_of_tests(mutants: list[Mutant]) -> list[str]:
    """The chosen mutants' pytest arguments, each once, a node id dropped where its whole file is listed."""
    tests = list(dict.fromkeys(t for m in mutants for t in m.tests))
    files = {t for t in tests if "::" not in t}
    return [t for t in tests if t.split("::")[0] not in files or "::" not in t]


def hardware() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def write_results(results: list[dict[str, object]], command: str, seconds: float, at_commit: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    killed = sum(r["status"] == "killed" for r in results)
    payload = {"command": command, "commit": at_commit, "hardware": hardware(), "python": platform.python_version(),
               "seconds": round(seconds, 1), "killed": killed, "total": len(results), "mutants": results}
    (RESULTS / "mutants.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# Mutation check", "",
        f"`{command}` at commit `{payload['commit']}` on {payload['hardware']} (Python {payload['python']}), "
        f"{payload['seconds']} s.", "",
        f"**{killed} of {len(results)} mutants killed.** Each mutant is an exact text patch of one source file "
        "(catalogue in `scripts/mutants.py`), applied alone to a temporary copy of the repository; it is killed "
        "when the listed tests fail. The commit column names the source each mutant's run copied (a later "
        "`--update` re-runs the listed mutants after a fix). Before the first mutant, the union of the listed "
        "tests passed on the unmutated source (the script refuses to run otherwise).", "",
        "| mutant | file | lossy/wrong behaviour | status | killing test | s | commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['name']} | `{r['file']}` | {r['why']} | {r['status']} | `{r['killed_by']}` | "
                     f"{r['seconds']} | {r.get('commit', '')} |")
    (RESULTS / "mutants.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="run only the quick subset")
    parser.add_argument("--check", action="store_true", help="only check that every patch applies")
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant (default 900)")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/mutants.*")
    parser.add_argument("--update", action="store_true",
                        help="with --only: replace those mutants' entries in the committed results (re-runs after a fix)")
    args = parser.parse_args(argv)
    problems = check_catalogue()
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.check:
        print(f"all {len(CATALOGUE)} mutants apply to the current source")
        return 0
    chosen = [m for m in CATALOGUE if (not args.fast or m.fast)]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.name for m in CATALOGUE}
        if unknown:
            print(f"error: unknown mutant(s) {sorted(unknown)}", file=sys.stderr)
            return 2
        chosen = [m for m in CATALOGUE if m.name in wanted]
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="spec-verify-mutants-") as tmp:
        copy = Path(tmp)
        at_commit = commit()  # the source the copy holds (HEAD may move while the run goes on)
        copy_repository(copy)
        print(f"mutation run at commit {at_commit}", flush=True)
        tests = union_of_tests(chosen)
        code, failing, tail = baseline(copy, tests, args.timeout * 2)
        if code != 0:
            print(f"error: the selected tests do not pass on the unmutated source (pytest exit status {code}); a "
                  f"failing test would count as a kill. Fix these first: {', '.join(failing) or tail}",
                  file=sys.stderr)
            return 2
        print(f"baseline: the {len(tests)} selected test arguments pass on the unmutated source "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        for mutant in chosen:
            result = run_one(mutant, copy, args.timeout, at_commit)
            results.append(result)
            print(f"{result['status']:>8}  {mutant.name}  ({result['seconds']} s)  {result['killed_by']}", flush=True)
    seconds = time.perf_counter() - start
    killed = sum(r["status"] == "killed" for r in results)
    print(f"{killed} of {len(results)} mutants killed in {seconds:.0f} s")
    if args.update and args.only and (RESULTS / "mutants.json").exists():
        previous = json.loads((RESULTS / "mutants.json").read_text())
        # the current catalogue, in order: fresh entries where re-run, committed ones otherwise (a mutant
        # removed from the catalogue is dropped)
        known = {str(r["name"]): {"commit": previous["commit"], **r} for r in previous["mutants"]}
        known.update({str(r["name"]): r for r in results})
        merged = [known[m.name] for m in CATALOGUE if m.name in known]
        command = f"{previous['command']}; then python scripts/mutants.py --only {args.only} --update"
        write_results(merged, command, previous["seconds"] + seconds, at_commit)
    elif not args.no_write and not args.only:
        write_results(results, "python scripts/mutants.py" + (" --fast" if args.fast else ""), seconds, at_commit)
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
