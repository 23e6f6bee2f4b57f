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
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from spec_fast._hf_compat import cache_keyword
from spec_fast._sampling import first_max_index
from spec_fast.drafts.model import Drafter, finish_draft_model, truncated_config
from spec_fast.drafts.subset_head import SubsetHead
from spec_fast.drafts.head_drafter import HeadDrafter, HeadState

if TYPE_CHECKING:
    from spec_fast.lean.feature_mlp import FeatureMlpWeights

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


def _target_parts(target: Any) -> tuple[nn.Module, nn.Module]:
    """``(embed_tokens, lm_head)`` of a Llama-style target."""
    base = getattr(target, "model", None)
    if base is None or not hasattr(base, "embed_tokens") or not hasattr(base, "layers"):
        raise ValueError(f"trained drafts need a Llama-style target (model.embed_tokens), got {type(target).__name__}")
    return base.embed_tokens, target.get_output_embeddings()


def _layer_config(target_config: Any, num_layers: int, intermediate: int | None = None) -> Any:
    config = truncated_config(target_config, num_layers)
    if intermediate is not None:
        config.intermediate_size = intermediate
    return config


# ---------------------------------------------------------------------------------------------- distilled
def distilled_model(target: Any, vocab_ids: torch.Tensor, init_layers: tuple[int, ...] = (0,)) -> Any:
    """A ``len(init_layers)``-layer model of the target's class: copies of the target layers
    ``init_layers`` and of its final norm (trainable), the target's embedding and a :class:`SubsetHead`
    (shared, frozen). Only ``model.layers.*`` and ``model.norm.*`` are new weights."""
    embed, lm_head = _target_parts(target)
    total = len(target.model.layers)
    if not init_layers or any(not 0 <= i < total for i in init_layers):
        raise ValueError(f"init_layers must index the target's {total} layers, got init_layers={init_layers!r}")
    config = _layer_config(target.config, len(init_layers))
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


# ---------------------------------------------------------------------------------------------- heads
def head_config(target_config: Any, kind: str) -> Any:
    """Config of a feature head: one layer; ``eagle`` keeps the target's layer size, ``rnn`` uses an
    MLP of half the target's intermediate size (768 for SmolLM2)."""
    if kind not in ("eagle", "rnn"):
        raise ValueError(f"head kind must be 'eagle' or 'rnn', got kind={kind!r}")
    config = _layer_config(target_config, 1, None if kind == "eagle" else int(target_config.intermediate_size) // 2)
    config.vocab_size = 1
    return config


class _HeadOutput:
    def __init__(self, logits: torch.Tensor, features: torch.Tensor) -> None:
        self.logits = logits
        self.features = features


class FeatureHead(nn.Module):
    """A draft head reading target features (module docstring): ``eagle`` or ``rnn``.

    :meth:`features` maps ``embeds [B, Q, H]`` and ``prev_features [B, Q, H]`` to predicted features
    ``[B, Q, H]``. :meth:`forward` has the HF call signature :class:`~spec_fast.kv_cache.TreeKVCache` uses
    (``input_ids [B, Q]``, ``position_ids [B, Q]``, additive ``attention_mask [B, 1, Q, K]``, cache); it
    reads the previous features staged in :attr:`staged_features` (``[B, Q, H]``) by the drafter.
    """

    def __init__(self, target: Any, kind: str, vocab_ids: torch.Tensor) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaMLP,
            LlamaRMSNorm,
            LlamaRotaryEmbedding,
        )

        embed, lm_head = _target_parts(target)
        self.kind = kind
        self.config = head_config(target.config, kind)
        hidden = int(self.config.hidden_size)
        self.embed = [embed]  # shared, frozen: kept out of the module tree (not saved, not trained)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        if kind == "eagle":
            self.layer = LlamaDecoderLayer(self.config, layer_idx=0)
            self.layer_cache_keyword = cache_keyword(self.layer.forward)
            self.rotary = LlamaRotaryEmbedding(self.config)
        else:
            self.mlp_norm = LlamaRMSNorm(hidden, eps=self.config.rms_norm_eps)
            self.mlp = LlamaMLP(self.config)  # type: ignore[no-untyped-call]
        self.norm = LlamaRMSNorm(hidden, eps=self.config.rms_norm_eps)
        self.head = SubsetHead(lm_head, vocab_ids)
        self.staged_features: torch.Tensor | None = None
        #: the ``rnn`` head's weights for the native call (:meth:`use_native`), else None
        self._native: FeatureMlpWeights | None = None

    def init_from_target(self, target: Any) -> None:
        """Initialise the decoder layer (eagle) from the target's last layer and the norm from the target's
        final norm (training start)."""
        last = target.model.layers[-1]
        with torch.no_grad():
            if self.kind == "eagle":
                self.layer.load_state_dict(last.state_dict())
            self.norm.load_state_dict(target.model.norm.state_dict())
            hidden = self.fc.weight.shape[0]
            # start as "embedding + previous feature"
            self.fc.weight.zero_()
            self.fc.weight[:, :hidden] += torch.eye(hidden)
            self.fc.weight[:, hidden:] += torch.eye(hidden)

    def features(
        self,
        embeds: torch.Tensor,
        prev_features: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        """``embeds [B, Q, H]``, ``prev_features [B, Q, H]`` -> predicted features ``[B, Q, H]``.

        Without ``attention_mask`` the eagle layer attends causally (training on whole sequences)."""
        native_weights = self._native_weights(embeds)
        if native_weights is not None:
            from spec_fast.lean.feature_mlp import feature_mlp

            hidden = embeds.shape[-1]
            flat = feature_mlp(native_weights, embeds.reshape(-1, hidden).contiguous(),
                               prev_features.reshape(-1, hidden).contiguous())[0]
            return flat.view(embeds.shape)
        x = self.fc(torch.cat([embeds, prev_features.to(embeds.dtype)], dim=-1))
        if self.kind == "eagle":
            if position_ids is None:
                position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0).expand(x.shape[0], -1)
            rope = self.rotary(x, position_ids)
            cache_arg = {self.layer_cache_keyword: past_key_values}
            x = self.layer(x, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=past_key_values is not None, position_embeddings=rope, **cache_arg)
        else:
            x = x + self.mlp(self.mlp_norm(x))
        out: torch.Tensor = self.norm(x)
        return out

    def use_native(self, enabled: bool, target_lm_head: nn.Module | None = None, weights: str = "q8_0") -> None:
        """Gradient-free float32 CPU forwards run on the native kernels: the subset LM head
        (:meth:`SubsetHead.use_native`) and, for ``rnn``, the whole level with that head in one call
        (:mod:`spec_fast.lean.feature_mlp`), its four products quantised to ``weights`` (``"q8_0"``, GGUF's
        8-bit blocks: a quarter of the float32 bytes, which a level mostly spends its time reading, for a
        draft law within that rounding of the float32 head's) or kept as ``"float32"``; a no-op without the
        kernels."""
        from spec_fast.lean import native
        from spec_fast.lean.block_layout import GROUP, quantize_q8_0
        from spec_fast.lean.feature_mlp import FeatureMlpWeights

        if weights not in ("q8_0", "float32"):
            raise ValueError(f"weights must be 'q8_0' or 'float32', got weights={weights!r}")
        self.head.use_native(enabled, target_lm_head)
        self._native = None
        if (enabled and native.available() and self.fc.weight.device.type == "cpu" and self.kind == "rnn"
                and self.mlp_norm.variance_epsilon == self.norm.variance_epsilon and self.head.packed is not None):
            mlp, head = self.mlp, self.head
            linears = (("fc", self.fc), ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj))
            if any(int(layer.weight.shape[1]) % GROUP for _, layer in linears):
                weights = "float32"  # blocks need inputs in whole groups
            pack = quantize_q8_0 if weights == "q8_0" else native.pack_float32
            self._native = FeatureMlpWeights(
                int(self.fc.weight.shape[0]), int(mlp.gate_proj.weight.shape[0]), weights,
                **{name: pack(layer.weight.detach()) for name, layer in linears},
                mlp_norm=self.mlp_norm.weight.detach().float().contiguous(),
                norm=self.norm.weight.detach().float().contiguous(), eps=float(self.norm.variance_epsilon),
                head_kind=head.packed_kind, head=head.packed, subset=int(head.vocab_ids.shape[0]))

    def _native_weights(self, x: torch.Tensor) -> FeatureMlpWeights | None:
        """The native call's weights where it serves ``x`` (float32 on the CPU, no gradient wanted), else None."""
        if (self._native is None or x.dtype != torch.float32 or x.device.type != "cpu"
                or (torch.is_grad_enabled() and (x.requires_grad or self.fc.weight.requires_grad))):
            return None
        return self._native

    def level(self, embeds: torch.Tensor, prev_features: torch.Tensor, head_rows: list[int] | None
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``rnn``: ``embeds [R, H]`` and ``prev_features [R, H]`` -> ``(features [R, H], subset logits [n, S],
        first maxima [n])`` with the subset head's scores of the ``n`` rows ``head_rows`` only (None: no
        scores); in one native call where :meth:`use_native` prepared one, with the same bits as
        :meth:`features` and :class:`SubsetHead`'s scores give."""
        native_weights = self._native_weights(embeds)
        if native_weights is not None:
            from spec_fast.lean.feature_mlp import feature_mlp

            return feature_mlp(native_weights, embeds.contiguous(), prev_features.contiguous(), head_rows)
        features = self.features(embeds, prev_features)
        if head_rows is None:
            return features, None, None
        scores = self.head.scores(features[head_rows])
        return features, scores, first_max_index(scores)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, past_key_values: Any = None,
                use_cache: bool = True, output_hidden_states: bool = False) -> _HeadOutput:
        prev = self.staged_features
        if prev is None or prev.shape[:2] != input_ids.shape:
            raise ValueError("FeatureHead.forward needs staged_features [B, Q, H] matching input_ids [B, Q]")
        embeds = self.embed[0](input_ids)
        feats = self.features(embeds, prev, position_ids, attention_mask, past_key_values)
        return _HeadOutput(self.head(feats), feats)

    def new_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("head.")}


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
