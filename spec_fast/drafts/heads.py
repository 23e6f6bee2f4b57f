"""Trained drafts for the default target: a distilled one-layer draft model and two draft heads.

Three drafts, trained by :mod:`spec_fast.drafts.training` (``python scripts/train_drafts.py``) and committed as
safetensors under ``spec_fast/weights/`` (only the new weights; the target's embedding and LM head are
shared, frozen, and never saved):

``distilled``
    a separate causal LM: one Llama decoder layer (initialised from the target's layer 0) + its own final
    norm, reading the target's token embedding and writing through the target's LM head restricted to a
    vocabulary subset. It is an ordinary HF model (:func:`distilled_model`), so HF assisted generation can
    use the very same draft. It needs nothing from the target at run time.
``eagle``
    an EAGLE-style feature head: entry ``j`` reads ``concat(embed(x_j), f_{j-1})`` (``f`` = the target's
    final normed hidden state, the feature its LM head reads), maps it with a linear layer to the width
    ``H`` and runs one decoder layer (initialised from the target's last layer) with attention over its
    own KV cache; the
    output is the predicted feature ``f_j``, turned into logits by the target's LM head.
``rnn``
    a recurrent feature head of a different depth/cost: the same input map followed by a residual MLP
    block and no attention (no cache), ``f_j = g(embed(x_j), f_{j-1})``.

Both heads are advanced from the verifier's accepted hidden states (seed 000 (docs/papers.md) section 7): the engine
calls :meth:`HeadDrafter.observe_target` with the target's features of every committed entry, and the
pending tokens of the next step read those true features; draft-tree nodes read the feature their parent
entry predicted.

Vocabulary subset: every draft scores only the ``S`` most frequent tokens of the training data (the LM
head rows of those tokens, :class:`SubsetHead`); other tokens get logit ``-inf`` (draft probability 0).
The draft law only has to be a distribution over the target vocabulary, so this keeps every verifier
lossless while cutting the draft's LM head cost by ``V / S``.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from torch import nn

from spec_fast.drafts.feature_head import FeatureHead, head_config, layer_config, target_parts
from spec_fast.drafts.head_drafter import HeadDrafter, HeadState
from spec_fast.drafts.model import Drafter, finish_draft_model
from spec_fast.drafts.subset_head import SubsetHead

__all__ = [
    "DRAFT_NAMES", "DRAFTER_NAMES", "WEIGHTS_DIR", "SubsetHead", "FeatureHead", "distilled_model", "load_distilled",
    "load_head", "HeadDrafter", "HeadState", "load_drafter", "weights_path", "head_config",
]

#: Names of the committed drafts (``spec_fast/weights/<name>.safetensors``).
DRAFT_NAMES = ("distilled", "eagle", "rnn")
WEIGHTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights")


def weights_path(name: str, directory: str | None = None) -> str:
    if name not in DRAFT_NAMES:
        raise ValueError(f"draft name must be one of {DRAFT_NAMES}, got name={name!r}")
    return os.path.join(directory or WEIGHTS_DIR, f"{name}.safetensors")


# ---------------------------------------------------------------------------------------------- distilled
def distilled_model(target: Any, vocab_ids: torch.Tensor, init_layers: tuple[int, ...] = (0,)) -> Any:
    """A ``len(init_layers)``-layer model of the target's class: copies of the target layers
    ``init_layers`` and of its final norm (trainable), the target's embedding and a :class:`SubsetHead`
    (shared, frozen). Only ``model.layers.*`` and ``model.norm.*`` are new weights."""
    embed, lm_head = target_parts(target)
    total = len(target.model.layers)
    if not init_layers or any(not 0 <= i < total for i in init_layers):
        raise ValueError(f"init_layers must index the target's {total} layers, got init_layers={init_layers!r}")
    config = layer_config(target.config, len(init_layers))
    with torch.device("meta"):
        draft = type(target)(config)
    draft.model.embed_tokens = embed
    draft.model.rotary_emb = target.model.rotary_emb
    layers = []
    for new_index, i in enumerate(init_layers):
        layer = copy.deepcopy(target.model.layers[i])
        layer.self_attn.layer_idx = new_index  # the draft's own cache has len(init_layers) layers
        layers.append(layer)
    draft.model.layers = nn.ModuleList(layers)
    draft.model.norm = copy.deepcopy(target.model.norm)
    draft.lm_head = SubsetHead(lm_head, vocab_ids)
    return finish_draft_model(draft, target, "distilled draft could not build {name}")


def distilled_state(draft: Any) -> dict[str, torch.Tensor]:
    """The new weights of a :func:`distilled_model` (layers + final norm)."""
    return {k: v for k, v in draft.state_dict().items() if k.startswith(("model.layers.", "model.norm."))}


# ---------------------------------------------------------------------------------------------- loading
def _read(name: str, directory: str | None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    path = weights_path(name, directory)
    if not os.path.exists(path):
        raise ValueError(f"no weights for draft {name!r}: {path} is missing (run scripts/train_drafts.py)")
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(path, framework="pt") as handle:
        meta = dict(handle.metadata() or {})
        for key in handle.keys():
            tensors[key] = handle.get_tensor(key)
    return tensors, meta


def load_distilled(target: Any, directory: str | None = None) -> Any:
    """The committed ``distilled`` draft for ``target`` (an HF model; float32 like the target)."""
    tensors, meta = _read("distilled", directory)
    vocab_ids = tensors.pop("vocab_ids")
    init_layers = tuple(int(i) for i in meta.get("init_layers", "0").split(","))
    draft = distilled_model(target, vocab_ids, init_layers)
    dtype = next(target.parameters()).dtype
    missing = draft.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    if missing.unexpected_keys:
        raise ValueError(f"distilled weights have unexpected keys {missing.unexpected_keys[:3]}")
    return draft.eval()


def load_head(target: Any, kind: str, directory: str | None = None) -> FeatureHead:
    """The committed feature head ``kind`` (``eagle`` or ``rnn``) for ``target``."""
    tensors, _ = _read(kind, directory)
    vocab_ids = tensors.pop("vocab_ids")
    head = FeatureHead(target, kind, vocab_ids)
    dtype = next(target.parameters()).dtype
    result = head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    bad = [k for k in result.missing_keys if not k.startswith("head.")]
    if bad or result.unexpected_keys:
        raise ValueError(f"{kind} weights do not match the head: missing {bad[:3]}, unexpected {result.unexpected_keys[:3]}")
    return head.to(dtype).eval()


#: Every name :func:`load_drafter` accepts.
DRAFTER_NAMES = DRAFT_NAMES + ("heads", "retrieval") + tuple(f"{n}+retrieval" for n in DRAFT_NAMES)


def load_drafter(name: str, target: Any, directory: str | None = None, target_lm_head: nn.Module | None = None
                 ) -> Drafter:
    """A committed draft by name: ``distilled`` (a :class:`~spec_fast.drafts.model.ModelDrafter`), ``eagle`` or
    ``rnn`` (:class:`HeadDrafter`); ``heads`` is an alias of ``eagle``, the stronger head; ``retrieval``
    (:class:`~spec_fast.drafts.retrieval.RetrievalDrafter` over ``weights/datastore.npz`` and the row's own text);
    ``<draft>+retrieval`` (:class:`~spec_fast.drafts.hybrid.HybridDrafter`: retrieval where its match is at
    least 3 tokens long, the draft elsewhere). ``target_lm_head``: the running target's LM head where ``target``
    is an HF copy of it (:meth:`SubsetHead.use_native`)."""
    from spec_fast.drafts.model import ModelDrafter
    from spec_fast.drafts.hybrid import HybridDrafter
    from spec_fast.drafts.retrieval import DATASTORE_PATH, load_retrieval_drafter

    vocab_size = int(target.get_output_embeddings().weight.shape[0])
    datastore = os.path.join(directory, "datastore.npz") if directory else DATASTORE_PATH
    if name == "retrieval":
        return load_retrieval_drafter(vocab_size, datastore)
    base = name[: -len("+retrieval")]
    if name.endswith("+retrieval") and base in DRAFT_NAMES:
        return HybridDrafter(load_retrieval_drafter(vocab_size, datastore),
                             load_drafter(base, target, directory, target_lm_head))
    if name == "heads":
        name = "eagle"
    if name == "distilled":
        model = load_distilled(target, directory)
        model.lm_head.use_native(True, target_lm_head)
        return ModelDrafter(model)
    if name in ("eagle", "rnn"):
        head = load_head(target, name, directory)
        head.use_native(True, target_lm_head)
        return HeadDrafter(head)
    raise ValueError(f"draft name must be one of {DRAFTER_NAMES}, got name={name!r}")
