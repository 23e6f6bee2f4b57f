"""The registry: every acceptance rule the conformance run checks, with its source, check shape and expected verdict.

A :class:`Rule` names one engine's acceptance rule, where its public contract lives, which of the kit's checks
fits its tensors (token, chain or tree), whether its randomness can be enumerated (exact mode) or not
(statistical mode), and the verdict its documentation implies. The runner (:mod:`conformance.runner`) checks
every rule and compares the kit's verdict with the expected one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from spec_ref.testing import Arithmetic, Mode

from conformance import eagle, llama_cpp, medusa, seeds, sglang, vllm, vllm_ascend

__all__ = ["RULES", "Check", "Rule", "rule_named"]

Check = Literal["token", "chain", "tree"]


@dataclass(frozen=True)
class Rule:
    """One acceptance rule under test.

    ``build()`` returns the verifier in the kit's signature for ``check`` (built lazily: some rules import
    torch); ``lossless`` is the expected verdict and ``why`` the one-line reason; ``sizes`` overrides the
    budget's ladder of problem sizes ((V, K) for token checks, (V, L) for chains, (V, K, depth) for trees);
    ``seed_external(seed)`` seeds a generator the rule draws from outside the kit (torch); ``requires``
    lists optional modules the rule needs; ``control`` names the lossy rule that is this statistical pass's
    negative control; ``certificate()`` returns an exact-mode transcription of a statistical lossy rule, used
    to measure its worst-case total variation exactly.
    """

    name: str
    title: str
    source: str
    check: Check
    lossless: bool
    why: str
    build: Callable[[], Callable[..., Any]]
    mode: Mode = "exact"
    arithmetic: Arithmetic = "fraction"
    sizes: tuple[tuple[int, ...], ...] | None = None
    seed_external: Callable[[int], None] | None = None
    requires: tuple[str, ...] = ()
    control: str | None = None
    certificate: Callable[[], Callable[..., Any]] | None = None

    def missing(self) -> list[str]:
        """The required optional modules that are not installed."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


def _fixed(verifier: Callable[..., Any]) -> Callable[[], Callable[..., Any]]:
    return lambda: verifier


def _hf(weight: float | None) -> Callable[[], Callable[..., Any]]:
    def build() -> Callable[..., Any]:
        from conformance import hf  # imports torch and transformers lazily

        return hf.speculative_sampling(weight)

    return build


def _hf_seed(seed: int) -> None:
    from conformance import hf

    hf.seed_torch(seed)


def _hf_certificate() -> Callable[..., Any]:
    from conformance import hf

    return hf.ensemble_transcription(Fraction(1, 2))


VLLM = "vllm-project/vllm · vllm/v1/sample/rejection_sampler.py · rejection_random_sample_kernel, sample_recovered_tokens_kernel"
VLLM_GREEDY = "vllm-project/vllm · vllm/v1/sample/rejection_sampler.py · rejection_greedy_sample_kernel"
VLLM_BV = (
    "vllm-project/vllm · vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py · _rejection_kernel, "
    "_resample_kernel (Model Runner V2, PR 46781)"
)
SGLANG = "sgl-project/sglang · sgl-kernel/csrc/speculative/speculative_sampling.cuh · TreeSpeculativeSamplingTargetOnly"
SEED = "seed 002 (docs/papers.md section 3); docs/algorithms.md"

RULES: tuple[Rule, ...] = (
    Rule("vllm-rejection-sampler", "vLLM rejection sampler, draft with probabilities",
         f"{VLLM} (read at commit 0097a7bbf1d9)", "chain", True,
         "Leviathan's rule: accept with min(1, p/q), recover from (p - q)+ by an Exp(1) race",
         _fixed(vllm.rejection_sampler)),
    Rule("vllm-rejection-sampler-ngram", "vLLM rejection sampler, draft without probabilities (n-gram)",
         f"{VLLM} with draft_probs=None (read at commit 0097a7bbf1d9)", "chain", True,
         "the draft is taken as certain (q = 1): accept with p(x), recover from p without x; conditionally on "
         "the draft this is a target sample, whatever law the draft really came from",
         _fixed(vllm.rejection_sampler_without_draft_probs)),
    Rule("vllm-greedy", "vLLM greedy requests (argmax match)",
         f"{VLLM_GREEDY} (read at commit 0097a7bbf1d9)", "chain", True,
         "commits exactly the argmax path; checked through the Gumbel-max reduction (argmax of log p + Gumbel "
         "noise is a draw of p)",
         _fixed(vllm.greedy_on_sampled_argmax)),
    Rule("vllm-block-verification", "vLLM block verification, draft with probabilities",
         f"{VLLM_BV} (read at commit 02e318bde2cc)", "chain", True,
         "Sun et al. (arXiv 2403.10444) Algorithm 2: h_i = Z/(Z + 1 - w_i), residual (w_tau p - q)+",
         _fixed(vllm.block_verification)),
    Rule("vllm-block-verification-one-hot", "vLLM block verification, draft without probabilities",
         f"{VLLM_BV} without draft logits (read at commit 02e318bde2cc)", "chain", True,
         "block verification of a one-hot draft law: lossless given any realised draft",
         _fixed(vllm.block_verification_one_hot)),
    Rule("vllm-ascend-block-verify-before-fix", "vllm-ascend block verify before PR 7808",
         "vllm-project/vllm-ascend · vllm_ascend/sample/rejection_sampler.py · "
         "rejection_random_sample_block_verify_pytorch before PR 7808 (issue 7807; rule as described in PR 7603)",
         "chain", False,
         "accepts up to the last i with prod min(1, p/q) >= prod u, then the token-wise recovered token",
         _fixed(vllm_ascend.block_verify_before_fix), mode="statistical", arithmetic="float",
         sizes=((2, 2), (2, 3))),
    Rule("vllm-ascend-block-verify-before-fix-ngram", "vllm-ascend block verify before PR 7808, n-gram drafts",
         "vllm-project/vllm-ascend · vllm_ascend/sample/rejection_sampler.py · "
         "rejection_random_sample_block_verify_pytorch with draft_probs=None, before PR 7603 turned block verify "
         "off for draft-free proposers", "chain", False,
         "the same products with every draft probability 1, recovered token from p without the draft",
         _fixed(vllm_ascend.block_verify_before_fix_ngram), mode="statistical", arithmetic="float",
         sizes=((2, 2), (2, 3))),
    Rule("sglang-target-only", "SGLang target-only tree sampling, thresholds 1 (default)",
         f"{SGLANG} (read at commit b227f63247cd), threshold_single = threshold_acc = 1", "tree", True,
         "one coin per node against the cumulative target mass of the siblings: a target draw per visited node",
         lambda: sglang.target_only()),
    Rule("sglang-target-only-acc-0.5", "SGLang target-only tree sampling, threshold_acc 0.5",
         f"{SGLANG} (read at commit b227f63247cd), --speculative-accept-threshold-acc 0.5", "tree", False,
         "coin <= prob_acc / 0.5 accepts up to twice the target mass: lossy by design",
         lambda: sglang.target_only(threshold_acc=Fraction(1, 2))),
    Rule("sglang-target-only-single-0.5", "SGLang target-only tree sampling, threshold_single 0.5",
         f"{SGLANG} (read at commit b227f63247cd), --speculative-accept-threshold-single 0.5", "tree", False,
         "any child with target probability >= 0.5 is accepted outright: lossy by design",
         lambda: sglang.target_only(threshold_single=Fraction(1, 2))),
    Rule("sglang-greedy-fallback", "SGLang EAGLE verify off CUDA at T > 0 (greedy fallback)",
         "sgl-project/sglang · python/sglang/srt/speculative/eagle_utils.py · eagle_sample "
         "(is_all_greedy or _is_cpu or _is_npu or _is_hip or _is_xpu -> argmax), before PRs 37134 and 39253",
         "tree", False,
         "a sampled request is verified and continued with the target argmax: temperature is ignored",
         _fixed(sglang.greedy_fallback)),
    Rule("llama-cpp-server", "llama.cpp server acceptance (draft must equal the target's sample)",
         "ggml-org/llama.cpp · common/sampling.cpp · common_sampler_sample_and_accept_n (tools/server)",
         "chain", True,
         "every committed token is the target sampler's own draw; acceptance is p(x), not min(1, p/q)",
         _fixed(llama_cpp.sample_and_accept_n)),
    Rule("medusa-typical-acceptance", "Medusa typical acceptance (medusa_generate defaults)",
         "FasterDecoding/Medusa · medusa/model/utils.py · evaluate_posterior(sampling='typical', fast=True), "
         "generate_candidates (read at commit 2b8981448074); arXiv 2401.10774 section 2.3.1",
         "tree", False,
         "accepts tokens above min(0.09, 0.3 exp(-H)), longest candidate wins, next token the argmax: lossy by "
         "design",
         lambda: medusa.typical_acceptance(), arithmetic="float"),
    Rule("eagle-target-only", "EAGLE sampled tree verification (q = 1 per sibling)",
         "SafeAILab/EAGLE · eagle/model/utils.py · evaluate_posterior, temperature > 0 branch "
         "(read at commit 8009b6d89d72)", "tree", True,
         "recursive rejection with a one-hot draft: each sibling accepted with the renormalised target mass",
         _fixed(eagle.evaluate_posterior)),
    Rule("hf-speculative-sampling", "HF transformers _speculative_sampling, as shipped",
         "huggingface/transformers · src/transformers/generation/utils.py · _speculative_sampling "
         "(the installed version, imported and called)", "chain", True,
         "Leviathan's Algorithm 1 on one chain; torch's global generator, so statistical",
         _hf(None), mode="statistical", arithmetic="float", sizes=((3, 2),), seed_external=_hf_seed,
         requires=("torch", "transformers"), control="hf-speculative-sampling-ensemble"),
    Rule("hf-speculative-sampling-ensemble", "HF _speculative_sampling with assistant_ensemble_weight 0.5",
         "huggingface/transformers · src/transformers/generation/utils.py · _speculative_sampling("
         "assistant_ensemble_weight=0.5) (the installed version); DIVERSE, arXiv 2604.07622",
         "chain", False,
         "verifies against 0.5 p + 0.5 q instead of p: lossy by design (the statistical pass's negative control)",
         _hf(0.5), mode="statistical", arithmetic="float", sizes=((3, 2),), seed_external=_hf_seed,
         requires=("torch", "transformers"), certificate=_hf_certificate),
    Rule("seed002-bv-as-described", "Seed 002 section 3.1: block verification accepting each node with w_i",
         f"{SEED} sections 5.2 and 7", "chain", False,
         "Sun et al. accept node i with h_i = Z_i/(Z_i + 1 - w_i), not w_i (equal only for the last node)",
         _fixed(seeds.bv_as_described)),
    Rule("seed002-alg14-as-written", "Seed 002 Algorithm 14 (SpecInfer branching law) used as a sampler",
         f"{SEED} sections 3.4 and 7", "token", False,
         "the printed recursion uses the acceptance ratio of the previous round (index off by one)",
         _fixed(seeds.specinfer_alg14_as_written)),
    Rule("seed002-spectr-lower-bracket", "SpecTr K-SEQ with rho from the lower bisection end (8 steps)",
         f"{SEED} sections 3.3 and 7 (seed 002 Appendix B.3: rho by binary search)", "token", False,
         "an infeasible rho makes the residual negative; clipping it changes the law by ~1e-4 to 2e-3",
         _fixed(seeds.spectr_lower_bracket), sizes=((2, 2), (3, 2), (4, 2), (4, 3))),
)


def rule_named(name: str) -> Rule:
    for rule in RULES:
        if rule.name == name:
            return rule
    raise KeyError(name)
