"""KV-cached decoding (minirl/inference/decoding.py, minirl/inference/llama_family.py): every logit a cached
batch returns is the one a full forward pass over that row's tokens gives, whichever decoder runs it,
whichever rows left, and
whatever part of the prompt came from a stored prefix."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from minirl.inference.decoding import CachedBatch, PrefixStore, StoredPrefix, TransformersDecoder
from minirl.inference.llama_family import LlamaFamilyDecoder

SIZES = dict(
    vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip

MODELS = {
    "qwen2": (lambda: Qwen2Config(**SIZES), LlamaFamilyDecoder),  # q/k/v biases
    "qwen3": (lambda: Qwen3Config(**SIZES, head_dim=16), LlamaFamilyDecoder),  # per-head q/k norms
    "llama": (lambda: LlamaConfig(**SIZES), LlamaFamilyDecoder),
    "qwen2 with sliding-window layers": (
        lambda: Qwen2Config(**SIZES, use_sliding_window=True, sliding_window=4096, max_window_layers=0),
        TransformersDecoder,
    ),
}


def random_model(name: str):
    torch.manual_seed(0)
    config, _ = MODELS[name]
    return AutoModelForCausalLM.from_config(config()).eval()


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    """[V] the next-token logits after `tokens`, from one forward pass over them alone."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1].float()


def random_prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 97, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("name", MODELS)
def test_cached_batch_logits_are_the_full_forward_logits_as_rows_leave(name):
    model = random_model(name)
    prompts = random_prompts([5, 9, 9, 3, 7, 12, 4, 6])
    prompts[2] = prompts[1]  # a group's rows share their prompt
    with torch.no_grad():
        batch = CachedBatch(model, prompts, pad_id=0)
        assert isinstance(batch.decoder, MODELS[name][1])
        rows = [list(p) for p in prompts]  # each live row's tokens so far
        g = torch.Generator().manual_seed(2)
        for step in range(70):  # past the decoder's first 64 spare columns
            for row, logits in zip(rows, batch.logits):
                torch.testing.assert_close(logits, full_logits(model, row), atol=1e-4, rtol=1e-4)
            tokens = torch.randint(3, 97, (len(rows),), generator=g)
            keep = None
            if step in (1, 2, 5, 30) and len(rows) > 1:  # one row leaves, then another; later two at once
                drop = {0, len(rows) // 2} if step == 30 else {step % len(rows)}
                keep = torch.tensor([i for i in range(len(rows)) if i not in drop])
                rows, tokens = [rows[i] for i in keep.tolist()], tokens[keep]
            for row, token in zip(rows, tokens.tolist()):
                row.append(token)
            batch.step(tokens, keep)
        assert len(rows) == 3


@pytest.mark.parametrize("name", ["qwen2", "qwen2 with sliding-window layers"])
def test_prompts_that_extend_stored_rows_encode_only_their_new_tokens(name):
    """A batch stores the rows it finishes; the next batch's prompts extend them by a few tokens (a tool's
    observation), and its prefill feeds only those while every logit stays the full forward's."""
    model = random_model(name)
    prompts = random_prompts([6, 10, 10, 4])
    store = PrefixStore()
    with torch.no_grad():
        batch = CachedBatch(model, prompts, pad_id=0, store=store)
        fed = [list(p) for p in prompts]  # every row's tokens, including row 1's after it leaves
        live = [0, 1, 2, 3]
        g = torch.Generator().manual_seed(3)
        for step in range(5):
            keep = torch.tensor([0, 2, 3]) if step == 2 else None  # row 1 leaves after feeding 2 tokens
            if keep is not None:
                live = [live[i] for i in keep.tolist()]
            tokens = torch.randint(3, 97, (len(live),), generator=g)
            for row, token in zip(live, tokens.tolist()):
                fed[row].append(token)
            batch.step(tokens, keep)
        batch.store_live_rows()
        assert sorted(len(p.tokens) for p in store._prefixes.values()) == [9, 11, 12, 15]

        observations = random_prompts([3, 7, 1, 5], seed=4)
        continued = [row + [7] + obs for row, obs in zip(fed, observations)]  # the last sampled token, then more
        fresh = random_prompts([8], seed=5)  # a prompt nothing was stored for
        widths = []
        hook = model.register_forward_pre_hook(
            lambda _, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
        )
        batch = CachedBatch(model, continued + fresh, pad_id=0, reuse=store)
        hook.remove()
        assert widths == [8]  # the longest new part: the fresh prompt; the others feed 1 + observation tokens
        for row, logits in zip(continued + fresh, batch.logits):
            torch.testing.assert_close(logits, full_logits(model, row), atol=1e-4, rtol=1e-4)
        tokens = torch.tensor([11, 12, 13, 14, 15])
        batch.step(tokens)
        for row, token, logits in zip(continued + fresh, tokens.tolist(), batch.logits):
            torch.testing.assert_close(logits, full_logits(model, row + [token]), atol=1e-4, rtol=1e-4)


def test_prefix_store_finds_the_longest_stored_prefix_with_at_least_one_new_token():
    store = PrefixStore()
    for tokens in [(1, 2), (1, 2, 3, 4), (1, 2, 3, 9), (1, 5), (2, 2)]:
        store.add(StoredPrefix(tokens, [], []))

    def longest(*prompt):
        found = store.longest(prompt)
        return found.tokens if found else None

    assert longest(1, 2, 3, 4, 5) == (1, 2, 3, 4)
    assert longest(1, 2, 3, 4) == (1, 2)  # a stored sequence is not its own prefix: one token must be new
    assert longest(1, 2, 3, 5) == (1, 2)  # (1, 2, 3, 4) and (1, 2, 3, 9) sort around it; neither is a prefix
    assert longest(1, 2, 7) == (1, 2)
    assert longest(1, 5, 0) == (1, 5)
    assert longest(1, 3) is None and longest(2) is None and longest(3, 1) is None
