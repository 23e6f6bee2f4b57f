"""A plain decoding step (no draft: the root alone) without the tree machinery.

A step whose every row drafts nothing verifies a tree of one node: the target's pass over the roots, the
next token from the root's logits, every row keeping its root's entry. :meth:`SpeculativeDecoder.step
<spec_fast.engine.SpeculativeDecoder.step>` runs such a step through :func:`plain_step` where it applies,
which does what the four phases do on that tree without building it: no root-only draft batch, no tree
mask or depths, no accepted-slot tensors read back and walked, no index rows for the cache's commit
(:meth:`spec_fast.kv_cache.TreeKVCache.forward_committed`). Each operation it skips cost 10-50 us on one
CPU thread after a pass had streamed the weights through the caches; a plain step made ~40 of them.

The tokens, random streams, caches, drafters' pending tokens, proposer state and metrics it leaves are those
of the general step (tests/engine/test_plain_step.py runs both side by side): the next token is
:func:`~spec_fast._sampling.first_max_index` of the root's logits for greedy rows and, for sampled rows, the
inverse-CDF draw with the row's first verifier uniform of the step (:func:`spec_fast.engine.step_verify.
draw_plain`, as :func:`~spec_fast.engine.step_verify.verify_rows` draws its plain rows).
"""

from __future__ import annotations

import torch

from spec_fast._sampling import first_max_index
from spec_fast.drafts.proposer import PlainProposer, Proposer
from spec_fast.engine.commit import advance_head
from spec_fast.engine.decode_state import DecodeState
from spec_fast.engine.step_verify import VerifyStreams, _root_only, draw_plain

__all__ = ["plain_step"]


def plain_step(st: DecodeState, proposer: Proposer, device: torch.device
               ) -> tuple[list[list[int]], list[int]] | None:
    """One plain step of every row of ``st`` (``st.depth_caps`` all 0): ``(new tokens per row, tokens
    emitted per row)``, or None, with nothing done, where the general step must run: a row inactive or
    fresh (its root's logits are the prefill's), greedy and sampled rows mixed, a proposer that reads the
    target's hidden states (a trained head's are handed over here, as the commit does) or trees asked for, a
    drafter holding block entries, or a proposer that reads the verification."""
    batch = st.batch_size
    samplings = st.samplings
    greedy = samplings[0].greedy if samplings else True
    if (batch == 0 or proposer.reads_target_hidden or st.trees is not None or not all(st.active) or any(st.fresh)
            or any(s.greedy != greedy for s in samplings)
            or type(proposer).after_verify is not PlainProposer.after_verify
            or any(head.drafter.num_block(head.state) > 0 for head in st.heads)):
        return None
    for head in st.heads:
        head.pending_width = 0
    st.steps += 1
    roots = st.roots
    out = st.target_cache.forward_committed(torch.tensor(roots, dtype=torch.long, device=device).unsqueeze(1),
                                            output_hidden_states=st.wants_hidden)
    logits = out.logits[:, 0]  # [B, V]
    if greedy:  # the model's own argmax where its pass computed one with the logits (spec_fast.lean)
        best = getattr(out, "first_max", None)
        next_tokens = best[:, 0] if best is not None else first_max_index(logits)
    else:  # node 0's first uniform of the step, as verify_rows draws a plain row's token
        streams = VerifyStreams(st.verify_keys, st.verify_offsets())
        next_tokens = draw_plain(logits, samplings, streams.uniforms((batch, 1, 1))[:, 0, 0])
    accepted = [0] * batch
    if type(proposer).after_commit is not PlainProposer.after_commit:
        proposer.after_commit(st, None, _root_only(next_tokens, 0), accepted)
    chosen: list[int] = next_tokens.tolist()
    new_tokens: list[list[int]] = [[] for _ in range(batch)]
    for b in range(batch):
        token = chosen[b]
        # (no depth evidence: a tree of depth 0 counts nothing, and the row's entry exists since its first step)
        st.step_accepted[b] = st.step_drafted[b] = 0
        for head in st.heads:
            advance_head(head, b, [0], [roots[b]], [], token, False)
        roots[b] = token
        st.committed[b].append(token)
        outputs = st.outputs[b]
        if len(outputs) < st.max_new[b]:
            outputs.append(token)
            new_tokens[b].append(token)
        if len(outputs) >= st.max_new[b] or (outputs and outputs[-1] in st.eos):
            st.active[b] = False
    if st.wants_hidden:  # a trained head's features of every row's committed root, as the commit hands them over
        for head in st.heads:
            head.drafter.observe_target(head.state, out.hidden_states[-1],
                                        torch.zeros(batch, 1, dtype=torch.long, device=device),
                                        torch.ones(batch, dtype=torch.long, device=device))
    st.metrics.record_step(accepted, accepted)
    return new_tokens, [1] * batch
