"""The trained feature heads of :mod:`spec_fast.drafts.heads` (``eagle`` and ``rnn``) as modules: each maps a
token's embedding and the target's feature before it to the next feature and scores that with the target's LM
head over a vocabulary subset. :class:`spec_fast.drafts.head_drafter.HeadDrafter` drives one as a drafter;
:mod:`spec_fast.drafts.heads` trains, saves and loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from spec_fast._hf_compat import cache_keyword
from spec_fast._sampling import first_max_index
from spec_fast.drafts.model import truncated_config
from spec_fast.drafts.subset_head import SubsetHead

if TYPE_CHECKING:
    from spec_fast.lean.feature_mlp import FeatureMlpWeights

__all__ = ["FeatureHead", "head_config", "layer_config", "target_parts"]


def target_parts(target: Any) -> tuple[nn.Module, nn.Module]:
    """``(embed_tokens, lm_head)`` of a Llama-style target."""
    base = getattr(target, "model", None)
    if base is None or not hasattr(base, "embed_tokens") or not hasattr(base, "layers"):
        raise ValueError(f"trained drafts need a Llama-style target (model.embed_tokens), got {type(target).__name__}")
    return base.embed_tokens, target.get_output_embeddings()


def layer_config(target_config: Any, num_layers: int, intermediate: int | None = None) -> Any:
    config = truncated_config(target_config, num_layers)
    if intermediate is not None:
        config.intermediate_size = intermediate
    return config


def head_config(target_config: Any, kind: str) -> Any:
    """Config of a feature head: one layer; ``eagle`` keeps the target's layer size, ``rnn`` uses an
    MLP of half the target's intermediate size (768 for SmolLM2)."""
    if kind not in ("eagle", "rnn"):
        raise ValueError(f"head kind must be 'eagle' or 'rnn', got kind={kind!r}")
    config = layer_config(target_config, 1, None if kind == "eagle" else int(target_config.intermediate_size) // 2)
    config.vocab_size = 1
    return config


class _HeadOutput:
    def __init__(self, logits: torch.Tensor, features: torch.Tensor) -> None:
        self.logits = logits
        self.features = features


class FeatureHead(nn.Module):
    """A draft head reading target features (:mod:`spec_fast.drafts.heads`' docstring): ``eagle`` or ``rnn``.

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

        embed, lm_head = target_parts(target)
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
        if self._native_weights(embeds) is not None:  # the rnn's level in one native call
            hidden = embeds.shape[-1]
            flat = self.level(embeds.reshape(-1, hidden), prev_features.reshape(-1, hidden), None)[0]
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
