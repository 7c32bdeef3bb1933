"""KV-cached decoding (minirl/inference/decoding.py, minirl/inference/llama_family.py): every logit a cached
batch returns is the one a full forward pass over that row's tokens gives, whichever decoder runs it,
whichever rows left, and whatever part of the prompt came from a stored prefix. The decoding loop on it
(minirl/inference/loop.py): a row admitted between steps, or one whose neighbours are evicted, decodes as
it would alone; the end-of-turn rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from minirl.inference.decoding import CachedBatch, PrefixStore, StoredPrefix, TransformersDecoder
from minirl.inference.llama_family import LlamaFamilyDecoder
from minirl.inference.loop import DecodeLoop, RowRequest, Sampled, StopReason, end_of_turn_ids
from minirl.inference.sampling import SamplingParams

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


def test_a_consuming_store_keeps_a_prefix_until_every_row_that_stored_it_took_it():
    """Samples of a group that wrote the same turn store the same tokens; each of them, back at its own
    time, finds them, and the last one takes them out."""
    store = PrefixStore(consume=True)
    for _ in range(3):  # three rows left with the same tokens
        store.add(StoredPrefix((1, 2, 3), [], []))
    store.add(StoredPrefix((1, 2, 3, 4, 5), [], []))
    assert store.longest((1, 2, 3, 7)).tokens == (1, 2, 3)  # the first row back
    assert store.longest((1, 2, 3, 8), rows=2).tokens == (1, 2, 3)  # two rows back in one prefill
    assert store.longest((1, 2, 3, 9)) is None  # all three took it
    assert store.longest((1, 2, 3, 4, 5, 6)).tokens == (1, 2, 3, 4, 5)
    assert store.longest((1, 2, 3, 4, 5, 6)) is None

    keeping = PrefixStore()  # without consume a prefix stays for any number of rows
    keeping.add(StoredPrefix((1, 2), [], []))
    assert all(keeping.longest((1, 2, 3), rows=4).tokens == (1, 2) for _ in range(3))


def test_rows_that_wrote_the_same_turn_each_encode_only_their_new_tokens_when_they_come_back_apart():
    """Two rows with one prompt write the same tokens (greedy) and leave together; their next turns, with
    different observations, are admitted at different steps, and each prefill feeds only what was appended."""
    model = random_model("qwen2")
    store = PrefixStore(consume=True)
    widths = []
    model.register_forward_pre_hook(lambda _, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    prompt = random_prompts([9])[0]
    greedy = SamplingParams(4, temperature=0.0)
    with torch.no_grad():
        loop = DecodeLoop(model, pad_id=0, end_ids=frozenset(), reuse=store, store=store)
        first = loop.admit([RowRequest(prompt, greedy), RowRequest(prompt, greedy)])
        other = loop.admit([RowRequest(random_prompts([5], seed=2)[0], SamplingParams(40, temperature=0.0))])[0]
        sampled = {row: [] for row in first}
        while any(row in loop.rows for row in first):
            for s in loop.step():
                sampled.setdefault(s.row, []).append(s.token)
        assert sampled[first[0]] == sampled[first[1]]
        history = prompt + sampled[first[0]]
        for seed in (3, 4):  # one row's observation is in, a step later the other's
            loop.admit([RowRequest(history + random_prompts([6], seed=seed)[0], greedy)])
            loop.step()
        assert other in loop.rows
    assert widths == [9, 7, 7]  # the first prefill (prompts deduplicated), then 1 token fed back + 6 appended


# -- the decoding loop ----------------------------------------------------------------------------

GREEDY = SamplingParams(12, temperature=0.0)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def run(loop: DecodeLoop, admissions: dict[int, list[RowRequest]], evictions: dict[int, list[int]] | None = None):
    """Step `loop` to the end, admitting admissions[s] and evicting the rows at evictions[s] (indices into
    all the rows admitted so far) before step s; every row's Sampled, by the order it was admitted."""
    evictions = evictions or {}
    ids: list[int] = []
    out: dict[int, list[Sampled]] = {}
    with torch.no_grad():
        for step in range(100):
            ids += loop.admit(admissions.get(step, []))
            for index in evictions.get(step, []):
                loop.evict(ids[index])
            if not loop.rows and step > max(admissions):
                break
            for sampled in loop.step():
                out.setdefault(sampled.row, []).append(sampled)
    return [out.get(row, []) for row in ids]


def alone(model, request: RowRequest) -> list[Sampled]:
    again = RowRequest(request.prompt, request.params, request.generator and seeded(request.generator.initial_seed()))
    return run(DecodeLoop(model, 0, frozenset()), {0: [again]})[0]


def assert_same_row(got: list[Sampled], expected: list[Sampled]) -> None:
    assert [s.token for s in got] == [s.token for s in expected]
    assert [s.stop for s in got] == [s.stop for s in expected]
    torch.testing.assert_close(torch.tensor([s.logprob for s in got]), torch.tensor([s.logprob for s in expected]))


def assert_full_forward_logprobs(model, request: RowRequest, row: list[Sampled]) -> None:
    """Each sampled token's log-prob is its log-prob under a full forward pass over the row's tokens."""
    tokens = [s.token for s in row]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([request.prompt + tokens])).logits[0, len(request.prompt) - 1 : -1]
    expected = request.params.logprobs(logits.float()).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor([s.logprob for s in row]), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["qwen2", "qwen2 with sliding-window layers"])
def test_a_row_admitted_between_steps_decodes_as_it_would_alone(name):
    """Rows join a batch that has decoded for a few steps (one row of it evicted, so the cache holds a dead
    row): a prompt longer than what the batch's cache holds and shorter ones, greedy and seeded. Every row
    samples the tokens it samples alone, with its log-probs, which are the full forward pass's."""
    model = random_model(name)
    first = random_prompts([5, 9, 3, 7, 6])
    later = random_prompts([30, 2, 8], seed=6)
    sampled = SamplingParams(12, temperature=1.0)
    requests = [RowRequest(p, GREEDY) for p in first[:4]] + [RowRequest(first[4], sampled, seeded(1))]
    joining = [RowRequest(later[0], GREEDY), RowRequest(later[1], sampled, seeded(2)), RowRequest(later[2], GREEDY)]
    rows = run(DecodeLoop(model, 0, frozenset()), {0: requests, 4: joining}, evictions={3: [1]})
    assert len(rows[1]) == 3 and rows[1][-1].stop is None  # evicted after three steps: no result says why
    for index, (request, row) in enumerate(zip(requests + joining, rows)):
        if index == 1:
            assert_same_row(row, alone(model, request)[:3])
            continue
        assert len(row) == 12 and row[-1].stop is StopReason.length
        assert_same_row(row, alone(model, request))
        assert_full_forward_logprobs(model, request, row)


def test_evicting_rows_leaves_the_others_unchanged():
    """Rows evicted at different steps (one before it ever sampled) change no other row's tokens or log-probs,
    greedy or drawing from its own generator. (Rows drawing from the global RNG draw as one batch: their
    draws depend on which rows are in it, as a rollout's always have.)"""
    model = random_model("qwen2")
    prompts = random_prompts([4, 8, 6, 5, 7])
    sampled = SamplingParams(10, temperature=1.2, top_k=20)

    def requests() -> list[RowRequest]:
        return [RowRequest(p, sampled, seeded(i)) for i, p in enumerate(prompts[:3])] + [
            RowRequest(p, GREEDY) for p in prompts[3:]
        ]

    everyone = run(DecodeLoop(model, 0, frozenset()), {0: requests()})
    evicted = run(DecodeLoop(model, 0, frozenset()), {0: requests()}, evictions={0: [1], 3: [3]})
    assert evicted[1] == [] and len(evicted[3]) == 3
    for row in (0, 2, 4):
        assert_same_row(evicted[row], everyone[row])
        assert_full_forward_logprobs(model, requests()[row], evicted[row])


def test_rows_leave_on_an_end_of_turn_token_or_at_their_own_token_limit():
    model = random_model("qwen2")
    prompts = random_prompts([4, 8, 6])
    with torch.no_grad():
        free = run(DecodeLoop(model, 0, frozenset()), {0: [RowRequest(p, GREEDY) for p in prompts]})
    end = free[1][4].token  # row 1's fifth greedy token ends its turn now
    requests = [RowRequest(prompts[0], SamplingParams(3, temperature=0.0))] + [
        RowRequest(p, GREEDY) for p in prompts[1:]
    ]
    rows = run(DecodeLoop(model, 0, frozenset({end})), {0: requests})
    assert [s.stop for s in rows[0]] == [None, None, StopReason.length]
    for row, expected in zip(rows, free):
        cut = next((i + 1 for i, s in enumerate(expected) if s.token == end), len(expected))
        assert [s.token for s in row] == [s.token for s in expected][: min(cut, len(row))]
    assert rows[1][-1].stop is StopReason.stop and len(rows[1]) <= 5


@pytest.mark.parametrize(
    ("listed", "expected"),
    [(None, {2}), (2, {2}), (7, {2, 7}), ([7, 2, 9], {2, 7, 9}), ([], {2})],
)
def test_a_turn_ends_on_the_tokenizers_eos_and_every_generation_config_eos(listed, expected):
    tokenizer = SimpleNamespace(eos_token_id=2)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=listed))
    assert end_of_turn_ids(tokenizer, model) == frozenset(expected)


def test_the_end_of_turn_rule_without_a_generation_config_or_a_tokenizer_eos():
    assert end_of_turn_ids(SimpleNamespace(eos_token_id=2), SimpleNamespace(generation_config=None)) == {2}
    listing = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, 9]))
    assert end_of_turn_ids(SimpleNamespace(eos_token_id=None), listing) == {7, 9}
