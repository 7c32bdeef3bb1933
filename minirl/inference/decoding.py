"""Forward passes that reuse a KV cache instead of recomputing what rows share.

`CachedBatch`: step-wise decoding of a batch of prompts on one KV cache, under the decoding loop
(`minirl.inference.loop.DecodeLoop`) that the `torch` rollout engine and the server's decoder consume. The
distinct prompts are encoded in one prefill (`prefill`), only past what a `PrefixStore` holds for them;
every later step feeds each live row its last token, with an explicit attention mask and position ids so
padding never shifts a row's positions. Rows that finish leave the batch, and the cache is compacted once a
quarter of its rows have left, so the remaining steps cost about the live rows; rows admitted between steps
are prefilled on their own and their cache joins the batch's (`CachedBatch.admit`). A step runs on
`minirl.inference.llama_family.LlamaFamilyDecoder` (a preallocated cache, the model's submodules called
directly) for Llama-family models and on the model's own forward (`TransformersDecoder`) for the others.

`prompt_shared_logits`: the trainer's forward over whole trajectories, with each group's prompt, which
its rows share, encoded once.
"""

from __future__ import annotations

import bisect
import inspect
from collections import Counter
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from minirl.inference.llama_family import LlamaFamilyDecoder, stacked_right_aligned, supports


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


@dataclass
class StoredPrefix:
    """Keys and values that a batch computed for the tokens it fed one row (its prompt and every token it fed
    back): keys[l], values[l] are layer l's [kv_heads, len(tokens), head_dim]."""

    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class PrefixStore:
    """The rows a decoding batch finished, for the next batch to reuse: a conversation's next prompt starts
    with every token its last turn fed the model (token in, token out), so its prefill need only encode what
    was appended since. Valid only for the weights that computed them. With `consume`, a prefix found is
    taken out: the row that extends it holds it in its own cache from then on (an agent loop whose rows come
    back turn after turn keeps one copy of each conversation, not one per turn). Rows that stored the same
    tokens (samples of a group that wrote the same turn) are counted, and it is taken out at its last use, so
    each of them finds it however far apart they come back."""

    def __init__(self, consume: bool = False) -> None:
        self.consume = consume
        self._prefixes: dict[tuple[int, ...], StoredPrefix] = {}
        self._stored: dict[tuple[int, ...], int] = {}  # with consume: rows that stored it and have not taken it
        self._order: list[tuple[int, ...]] = []  # sorted token sequences, built at the first lookup

    def add(self, prefix: StoredPrefix) -> None:
        if prefix.tokens not in self._prefixes:
            self._order = []
        self._prefixes[prefix.tokens] = prefix
        if self.consume:
            self._stored[prefix.tokens] = self._stored.get(prefix.tokens, 0) + 1

    def longest(self, prompt: tuple[int, ...], rows: int = 1) -> StoredPrefix | None:
        """The longest stored sequence that `prompt` extends by at least one token, or None; with `consume`,
        taken by `rows` rows (those that have this prompt).

        In sorted order every stored prefix of `prompt` sits below it, and any sequence between the longest
        one and `prompt` starts with it, so a walk down from `prompt`'s place meets the longest one first."""
        if self._prefixes and not self._order:
            self._order = sorted(self._prefixes)
        for i in range(bisect.bisect_left(self._order, prompt) - 1, -1, -1):
            tokens = self._order[i]
            if prompt[: len(tokens)] == tokens:
                if self.consume:
                    self._stored[tokens] -= rows
                    if self._stored[tokens] <= 0:
                        del self._stored[tokens]
                        self._order = []
                        return self._prefixes.pop(tokens)
                return self._prefixes[tokens]
            if tokens[:1] != prompt[:1]:  # sorted: nothing further down shares even the first token
                return None
        return None


def prefill(
    model, cache: DynamicCache, prompts: list[tuple[int, ...]], pad_id: int, reuse: PrefixStore | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode each distinct prompt (none empty) once into `cache` and copy its KV to every row that has it:
    (the rows' attention mask over the cache [N, C], their next-token logits [N, V] float32).

    A prompt that extends a sequence in `reuse` encodes only its new tokens on top of the stored keys and
    values. The cache's columns hold the reused part right-aligned in the first `old_width`, then the new
    tokens right-aligned in the last `new_width` (each row's last token in the last column); the padding
    before each part is masked, and position ids count a row's own tokens only."""
    device = next(model.parameters()).device
    rows_of = Counter(prompts)  # distinct prompt -> how many rows have it, in first-seen order
    distinct = list(rows_of)
    reused = [reuse.longest(prompt, rows_of[prompt]) if reuse is not None else None for prompt in distinct]
    old = [len(prefix.tokens) if prefix is not None else 0 for prefix in reused]  # tokens whose KV is reused
    old_width, reused_lengths = max(old), torch.tensor(old)[:, None]  # [U, 1]
    ids, new_attention = left_padded([prompt[n:] for prompt, n in zip(distinct, old)], pad_id)  # [U, new_width]
    positions = (reused_lengths + new_attention.cumsum(-1) - 1).clamp(min=0)  # [U, new_width]; pads masked
    old_attention = (torch.arange(old_width) >= old_width - reused_lengths).long()  # [U, old_width]
    if old_width > 0:
        _fill(cache, reused, old_width, device)
    attention = torch.cat([old_attention, new_attention], dim=1).to(device)
    out = model(
        input_ids=ids.to(device),
        attention_mask=attention,
        position_ids=positions.to(device),
        **{cache_argument(model): cache},
        use_cache=True,
        logits_to_keep=1,
    )
    index = {prompt: row for row, prompt in enumerate(distinct)}
    rows = torch.tensor([index[prompt] for prompt in prompts], device=device)  # [N] the distinct prompt of each
    cache.batch_select_indices(rows)
    return attention[rows], out.logits[:, -1].float()[rows]


def _fill(cache: DynamicCache, reused: list[StoredPrefix | None], width: int, device: torch.device) -> None:
    """Put each row's reused keys and values, right-aligned, into the first `width` columns of every layer."""
    first = next(prefix for prefix in reused if prefix is not None)
    for layer in range(len(first.keys)):
        kv_heads, _, head_dim = first.keys[layer].shape
        keys = first.keys[layer].new_zeros((len(reused), kv_heads, width, head_dim), device=device)
        values = torch.zeros_like(keys)
        for row, prefix in enumerate(reused):
            if prefix is not None:
                keys[row, :, width - len(prefix.tokens) :] = prefix.keys[layer]
                values[row, :, width - len(prefix.tokens) :] = prefix.values[layer]
        cache.update(keys, values, layer)


class TransformersDecoder:
    """The KV cache of a batch of rows after their prefill, and one decoding step on it through the model's
    own forward: the path for every model `minirl.inference.llama_family.supports` does not accept.

    `attention`: [B, P + steps] 0/1, the columns of the cache each row attends to."""

    def __init__(self, model, cache: DynamicCache, attention: torch.Tensor) -> None:
        self.model, self.cache, self.attention = model, cache, attention
        self.cache_arg = cache_argument(model)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current rows, ascending)."""
        self.cache.batch_select_indices(rows)
        self.attention = self.attention[rows]

    def join(self, cache: DynamicCache, attention: torch.Tensor) -> None:
        """Add the rows of another prefill (its DynamicCache and [N, P] 0/1 mask) after the current ones, the
        narrower side with masked columns in front (see `LlamaFamilyDecoder.join`)."""
        width = max(self.attention.shape[1], attention.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = stacked_right_aligned([mine.keys, theirs.keys], width, 2)
            mine.values = stacked_right_aligned([mine.values, theirs.values], width, 2)
        self.attention = stacked_right_aligned([self.attention, attention], width, 1)

    def row_cache(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row `row`'s keys and values per layer, [kv_heads, tokens it attends to, head_dim] each."""
        used = self.attention[row].bool()
        keys = [layer.keys[row][:, used] for layer in self.cache.layers]
        return keys, [layer.values[row][:, used] for layer in self.cache.layers]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed each row one token (`tokens`, `positions`: [B] ids and positions); [B, V] float32 next logits."""
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(self.attention), 1)], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attention,
            position_ids=positions[:, None],
            **{self.cache_arg: self.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()


class CachedBatch:
    """Prompts decoding together on `model` (an eval-mode causal LM); `logits` holds the live rows'
    next-token logits, [B, V] float32, B = rows still in the batch, in their original order (rows admitted
    later after them, in the order admitted).

    A row that leaves stays in the cache, fed padding, until a quarter of the rows have left: then the
    cache is compacted to the live rows (one copy for many rows, not one per row). With `reuse`, a prompt
    that extends a stored sequence encodes only its new tokens (`prefill`). With `store`, every row that
    leaves, and each live one at `store_live_rows`, is stored there with the tokens it fed (its prompt and
    every token fed back by `step`)."""

    def __init__(
        self, model, prompts: list[list[int]], pad_id: int,
        reuse: PrefixStore | None = None, store: PrefixStore | None = None,
    ) -> None:  # fmt: skip
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        cache = DynamicCache()  # filled in place by the prefill
        # a group's samples share one prompt: prefill each distinct prompt once, then copy its row;
        # attention [B, C], logits [B, V]
        attention, self.logits = prefill(model, cache, list(map(tuple, prompts)), pad_id, reuse)
        self.positions = torch.tensor([len(p) - 1 for p in prompts], device=self.device)  # [R] last positions
        decoder = LlamaFamilyDecoder if supports(model) else TransformersDecoder
        self.decoder = decoder(model, cache, attention)
        self.live = list(range(len(prompts)))  # the cache rows of the rows still in the batch
        self.live_index: torch.Tensor | None = None  # self.live as a tensor while some cache rows are dead
        self.store = store
        self.fed = [list(p) for p in prompts] if store is not None else None  # each cache row's tokens so far

    def step(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Drop the rows not in `keep` (indices into the current rows, ascending; None keeps all), feed
        each kept row its next token (`tokens`: [B'] ids of the kept rows) and return their logits."""
        if keep is not None:
            kept = [self.live[row] for row in keep.tolist()]
            if self.store is not None:
                for row in set(self.live) - set(kept):
                    self._store(row)
            self.live = kept
            if len(kept) <= 3 * len(self.positions) // 4:
                self._compact()
            dead = len(self.live) < len(self.positions)
            self.live_index = torch.tensor(self.live, device=self.device) if dead else None
        if self.fed is not None:
            for row, token in zip(self.live, tokens.tolist()):
                self.fed[row].append(token)
        tokens = tokens.to(self.device)
        if self.live_index is not None:  # rows that left are fed padding; their logits are dropped
            padded = torch.full((len(self.positions),), self.pad_id, device=self.device)
            tokens = padded.index_copy_(0, self.live_index, tokens)
        self.positions = self.positions + 1
        logits = self.decoder.step(tokens, self.positions)  # [R, V]
        self.logits = logits if self.live_index is None else logits[self.live_index]
        return self.logits

    def admit(self, prompts: list[list[int]], reuse: PrefixStore | None = None) -> None:
        """Add rows for `prompts` (none empty) after the live ones; `logits` gains their rows at its end. The
        cache is first compacted to the live rows; the new rows are prefilled on their own (reusing what
        `reuse` holds for them) and their cache joins the batch's, so each row's logits are the ones it gets
        decoding alone, up to the rounding of batched matrix products."""
        if self.live_index is not None:
            self._compact()
            self.live_index = None
        cache = DynamicCache()
        attention, logits = prefill(self.model, cache, list(map(tuple, prompts)), self.pad_id, reuse)
        self.decoder.join(cache, attention)
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        self.positions = torch.cat([self.positions, last])
        self.logits = torch.cat([self.logits, logits])
        self.live = list(range(len(self.positions)))
        if self.fed is not None:
            self.fed += [list(p) for p in prompts]

    def _compact(self) -> None:
        live = torch.tensor(self.live, device=self.device)
        self.decoder.select(live)
        self.positions = self.positions[live]
        if self.fed is not None:
            self.fed = [self.fed[row] for row in self.live]
        self.live = list(range(len(self.live)))

    def store_live_rows(self) -> None:
        """Store every row still in the batch in `store` (see the class docstring)."""
        for row in self.live:
            self._store(row)

    def _store(self, row: int) -> None:
        keys, values = self.decoder.row_cache(row)
        self.store.add(StoredPrefix(tuple(self.fed[row]), keys, values))


def drops_cache(model) -> bool:
    """Whether `model`'s layers ignore a KV cache passed in: transformers' gradient checkpointing, in training mode,
    runs each layer without one (a recomputed layer would extend it twice), so a suffix could not see its prefix."""
    return any(getattr(module, "gradient_checkpointing", False) and module.training for module in model.modules())


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
    plain forward. Under gradient checkpointing in training mode it is the plain forward (drops_cache)."""
    n, width = input_ids.shape
    prefixes = [tuple(input_ids[row, :start].tolist()) for row, start in enumerate(prefix_lengths.tolist())]
    # nothing shared, or an empty prefix, or layers that drop a cache: the plain forward
    if len(set(prefixes)) == n or min(map(len, prefixes)) == 0 or drops_cache(model):
        return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
    device = input_ids.device
    cache = DynamicCache()
    prefix_attention, _ = prefill(model, cache, prefixes, pad_id=0)  # [N, P]
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
