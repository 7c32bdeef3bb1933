"""Forward passes that reuse a KV cache instead of recomputing what rows share.

`CachedBatch`: step-wise decoding of a batch of prompts on one KV cache, the core of the `torch` rollout
engine and of the server's decoder. The distinct prompts are left-padded into one prefill; every later
step feeds each live row its last token, with an explicit attention mask and position ids so padding
never shifts a row's positions. Rows that finish leave the batch and the KV cache at once, so the
remaining steps cost only the live rows.

`prompt_shared_logits`: the trainer's forward over whole trajectories, with each group's prompt, which
its rows share, encoded once.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


def cache_argument(model) -> str:
    """The name of forward's KV-cache argument: transformers 5.24 renamed `past_key_values` to `cache`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, P] token ids and attention mask of `prompts`, each right-aligned after `pad_id` padding."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention[row, width - len(prompt) :] = 1
    return ids, attention


def prefill_once(
    model, cache: DynamicCache, prompts: list[tuple[int, ...]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode each distinct prompt (none empty) once into `cache`, left-padded, and copy its KV to every row
    that has it: (the rows' attention mask over the cache [N, P], their next-token logits [N, V] float32)."""
    device = next(model.parameters()).device
    distinct = list(dict.fromkeys(prompts))
    ids, attention = (t.to(device) for t in left_padded(distinct, pad_id))  # [U, P] each
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [U, P]; pads get 0, masked anyway
    out = model(
        input_ids=ids,
        attention_mask=attention,
        position_ids=positions,
        **{cache_argument(model): cache},
        use_cache=True,
        logits_to_keep=1,
    )
    index = {prompt: row for row, prompt in enumerate(distinct)}
    rows = torch.tensor([index[prompt] for prompt in prompts], device=device)  # [N] the distinct prompt of each
    cache.batch_select_indices(rows)
    return attention[rows], out.logits[:, -1].float()[rows]


class CachedBatch:
    """Prompts decoding together on `model` (an eval-mode causal LM); `logits` holds the live rows'
    next-token logits, [B, V] float32, B = rows still in the batch, in their original order."""

    def __init__(self, model, prompts: list[list[int]], pad_id: int) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache_arg = cache_argument(model)
        self.cache = DynamicCache()  # filled in place by every forward
        # a group's samples share one prompt: prefill each distinct prompt once, then copy its row;
        # attention [B, P + steps], logits [B, V]
        self.attention, self.logits = prefill_once(model, self.cache, list(map(tuple, prompts)), pad_id)
        self.positions = self.attention.sum(dim=-1, keepdim=True) - 1  # [B, 1] each row's last position

    def step(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Drop the rows not in `keep` (indices into the current rows, ascending; None keeps all), feed
        each kept row its next token (`tokens`: [B'] ids of the kept rows) and return their logits."""
        if keep is not None:
            keep = keep.to(self.device)
            self.cache.batch_select_indices(keep)
            self.attention, self.positions = self.attention[keep], self.positions[keep]
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(self.attention), 1)], dim=1)
        self.positions = self.positions + 1
        self.logits = self._forward(tokens.to(self.device).view(-1, 1), self.attention, self.positions)
        return self.logits

    def _forward(self, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            **{self.cache_arg: self.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()  # [B, V]


def prompt_shared_logits(
    model,
    input_ids: torch.Tensor,  # [N, L] right-padded rows
    attention_mask: torch.Tensor,  # [N, L]
    prefix_lengths: torch.Tensor,  # [N] leading tokens of each row; rows with the same ones share them
    keep: int,  # logits of the last `keep` positions
) -> torch.Tensor:  # [N, keep, V]
    """`model(input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits` at every position from
    each row's prefix end on, with each distinct prefix (a group's prompt) encoded once and its KV cache
    copied to the rows that share it. Logits inside a row's prefix are for no caller: they come back 0 when
    the prefix is shared (they are not computed). Gradients reach a shared prefix from every row, as in the
    plain forward."""
    n, width = input_ids.shape
    prefixes = [tuple(input_ids[row, :start].tolist()) for row, start in enumerate(prefix_lengths.tolist())]
    if len(set(prefixes)) == n or min(map(len, prefixes)) == 0:  # nothing shared, or an empty prefix: plain forward
        return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
    device = input_ids.device
    cache = DynamicCache()
    prefix_attention, _ = prefill_once(model, cache, prefixes, pad_id=0)  # [N, P]
    starts = prefix_lengths.to(device)
    lengths = attention_mask.sum(dim=1, keepdim=True)  # [N, 1]
    span = int((lengths.squeeze(1) - starts).max())  # the longest suffix
    columns = starts[:, None] + torch.arange(span, device=device)  # [N, S] each suffix token's position in its row
    inside = columns < lengths  # [N, S]; False on padding
    suffix = input_ids.gather(1, columns.clamp(max=width - 1)).masked_fill(~inside, 0)  # [N, S]
    out = model(
        input_ids=suffix,
        attention_mask=torch.cat([prefix_attention, inside.long()], dim=1),
        position_ids=columns,
        **{cache_argument(model): cache},
        use_cache=True,
    ).logits  # [N, S, V]
    offsets = torch.arange(width - keep, width, device=device) - starts[:, None]  # [N, keep] index into the suffix
    computed = (offsets >= 0) & (offsets < span)
    logits = out.gather(1, offsets.clamp(0, span - 1)[..., None].expand(-1, -1, out.shape[-1]))  # [N, keep, V]
    return logits.masked_fill_(~computed[..., None], 0.0)
