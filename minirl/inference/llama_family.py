"""One-token decoding steps for Llama-family causal LMs (Llama, Qwen2, Qwen3) on a preallocated KV cache.

A one-token step through transformers' forward spends most of its time on work that does not depend on the
token: it builds a 4-D attention mask, concatenates each layer's cached keys and values with the new ones, and
makes a dozen module calls per layer. `LlamaFamilyDecoder` keeps each layer's keys and values in a
[B, kv_heads, capacity, head_dim] buffer written in place, with one boolean mask over its columns, and runs
the model's own submodules (norms, projections, MLP, rotary embedding) and the same attention kernel, so its
logits are the model's. `minirl.inference.decoding.CachedBatch` uses it for every model `supports` accepts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

FAMILIES = frozenset({"llama", "qwen2", "qwen3"})


def stacked_right_aligned(parts: list[torch.Tensor], width: int, axis: int, room: int = 0) -> torch.Tensor:
    """The rows (dim 0) of `parts` one after another, each part's columns along `axis` ending at column `width`
    with zero (False) columns in front, and `room` zero columns after: one allocation, each part copied once."""
    shape = list(parts[0].shape)
    shape[0], shape[axis] = sum(len(part) for part in parts), width + room
    stacked = parts[0].new_zeros(shape)
    start = 0
    for part in parts:
        columns = part.shape[axis]
        stacked[start : start + len(part)].narrow(axis, width - columns, columns).copy_(part)
        start += len(part)
    return stacked


def supports(model) -> bool:
    """True for a Llama-family model (SiLU MLP, rotary positions) whose layers all attend to the full context."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        config.model_type in FAMILIES
        and config.hidden_act == "silu"
        and all(kind == "full_attention" for kind in layer_types)
    )


class LlamaFamilyDecoder:
    """The KV cache of a batch of rows after their prefill, and one decoding step on it.

    `keys[l]` / `values[l]`: [B, kv_heads, capacity, head_dim]; the first `width` columns are in use.
    `attention`: [B, capacity] bool, True on the columns a row attends to (its prompt's tokens, not the
    padding `minirl.inference.decoding.prefill` put around them, then every decoded token).
    """

    def __init__(self, model, cache: DynamicCache, attention: torch.Tensor, room: int = 64) -> None:
        """`cache`, `attention` ([B, P] 0/1): a prefill's DynamicCache and mask; `room`: columns to add at a time."""
        self.model, self.room = model, room
        self.width = attention.shape[1]
        self.keys = [self._widened(layer.keys) for layer in cache.layers]
        self.values = [self._widened(layer.values) for layer in cache.layers]
        self.attention = self._widened(attention.bool())

    def _widened(self, columns: torch.Tensor) -> torch.Tensor:
        """`columns` with `room` more zero columns along its column axis (dim 2 of a cache, 1 of a mask)."""
        axis = 2 if columns.dim() == 4 else 1
        shape = list(columns.shape)
        shape[axis] = self.room
        return torch.cat([columns, columns.new_zeros(shape)], dim=axis)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current rows, ascending)."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.attention = self.attention[rows]

    def join(self, cache: DynamicCache, attention: torch.Tensor) -> None:
        """Add the rows of another prefill (its DynamicCache and [N, P] 0/1 mask) after the current ones. The
        narrower side gets masked columns in front, so both sides write their next token to the same column;
        a row's positions are its own (they are passed to every step), so the shift changes no logit."""
        width = max(self.width, attention.shape[1])

        def joined(mine: torch.Tensor, theirs: torch.Tensor, axis: int) -> torch.Tensor:
            return stacked_right_aligned([mine.narrow(axis, 0, self.width), theirs], width, axis, self.room)

        self.keys = [joined(k, layer.keys, 2) for k, layer in zip(self.keys, cache.layers)]
        self.values = [joined(v, layer.values, 2) for v, layer in zip(self.values, cache.layers)]
        self.attention = joined(self.attention, attention.bool(), 1)
        self.width = width

    def row_cache(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row `row`'s keys and values per layer, [kv_heads, tokens it attends to, head_dim] each."""
        used = self.attention[row, : self.width]
        keys = [k[row, :, : self.width][:, used] for k in self.keys]
        return keys, [v[row, :, : self.width][:, used] for v in self.values]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed each row one token (`tokens`, `positions`: [B] ids and positions); [B, V] float32 next logits."""
        if self.width == self.attention.shape[1]:
            self.keys = [self._widened(k) for k in self.keys]
            self.values = [self._widened(v) for v in self.values]
            self.attention = self._widened(self.attention)
        column = self.width
        self.width += 1
        self.attention[:, column] = True
        mask = self.attention[:, None, None, : self.width]  # [B, 1, 1, width]
        body = self.model.model
        hidden = body.embed_tokens(tokens[:, None])  # [B, 1, H]
        cos, sin = body.rotary_emb(hidden, positions[:, None])  # [B, 1, head_dim] each
        for layer, keys, values in zip(body.layers, self.keys, self.values):
            hidden = hidden + self._attend(layer.self_attn, layer.input_layernorm(hidden), cos, sin, keys, values, mask)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(body.norm(hidden))[:, -1].float()

    def _attend(self, attn, hidden, cos, sin, keys, values, mask) -> torch.Tensor:
        """The attention block's output [B, 1, H] for `hidden` [B, 1, H]; writes its key and value into the cache."""
        rows = hidden.shape[0]
        shape = (rows, 1, -1, attn.head_dim)
        query, key = attn.q_proj(hidden).view(shape), attn.k_proj(hidden).view(shape)
        if hasattr(attn, "q_norm"):  # Qwen3 normalizes each head's query and key
            query, key = attn.q_norm(query), attn.k_norm(key)
        query, key = apply_rotary_pos_emb(query.transpose(1, 2), key.transpose(1, 2), cos, sin)  # [B, heads, 1, d]
        keys[:, :, self.width - 1] = key[:, :, 0]
        values[:, :, self.width - 1] = attn.v_proj(hidden).view(shape)[:, 0]
        out = F.scaled_dot_product_attention(
            query, keys[:, :, : self.width], values[:, :, : self.width], attn_mask=mask, scale=attn.scaling,
            enable_gqa=True,
        )  # fmt: skip
        return attn.o_proj(out.transpose(1, 2).reshape(rows, 1, -1))
