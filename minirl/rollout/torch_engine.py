"""Rollouts with a plain PyTorch decoding loop on the policy module itself (CPU or one GPU).

Unlike `generate`, which steps every row until the longest one ends, a row leaves the batch and the KV
cache as soon as it samples the end-of-turn token (`minirl.inference.decoding.CachedBatch`), so a batch whose
turns are mostly short costs about its mean length, not its longest. The keys and values of the rows a
call finished are kept until the next call, whose prompts continue those conversations: a turn's prefill
encodes only the observation and the template tokens appended since the last one (`PrefixStore`).
"""

from __future__ import annotations

import torch

from minirl.inference.decoding import CachedBatch, PrefixStore
from minirl.inference.sampling import draw, is_greedy, warped
from minirl.rollout.engine import ENGINES, Completion, ModuleEngine, SamplingParams


def sample_tokens(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` ([B, V] float32) and its log-prob ([B] each) under the distribution it
    was drawn from: temperature, then top-k and top-p, as generate's warpers; temperature 0 (or below
    GREEDY_BELOW) = greedy, scored under the raw logits as generate scores it."""
    if is_greedy(params.temperature):
        tokens = logits.argmax(dim=-1)  # [B]
        logprobs = logits.log_softmax(dim=-1)  # [B, V]
    else:
        logprobs = warped(logits, params.temperature, params.top_p, params.top_k).log_softmax(dim=-1)  # [B, V]
        tokens = draw(logprobs.exp())
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


@ENGINES.register("torch")
class TorchEngine(ModuleEngine):
    """Samples token by token on the trained module; finished rows leave the batch at once."""

    def __init__(self, model, tokenizer, device: torch.device, **kwargs: object) -> None:
        super().__init__(model, tokenizer, device, **kwargs)
        self.finished = PrefixStore()  # the last call's rows, for prompts that continue them

    def sync_weights(self, model) -> None:
        super().sync_weights(model)
        self.finished = PrefixStore()  # computed by the old weights

    def sample(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        completions = [Completion([], [], False) for _ in prompts]
        live = list(range(len(prompts)))  # indices into `prompts` of the rows still in the batch
        finished = PrefixStore()
        batch = CachedBatch(self.model, prompts, self.pad_id, reuse=self.finished, store=finished)
        self.finished = finished  # the last call's rows are in the new cache now: free their copies
        for step in range(params.max_new_tokens):
            tokens, logprobs = sample_tokens(batch.logits, params)
            for row, token, logprob in zip(live, tokens.tolist(), logprobs.tolist()):
                completions[row].token_ids.append(token)
                completions[row].logprobs.append(logprob)
            going = tokens != self.eos_id  # [B]
            if step == params.max_new_tokens - 1 or not going.any():
                break
            if going.all():
                batch.step(tokens)
            else:
                keep = going.nonzero().squeeze(-1)
                live = [live[i] for i in keep.tolist()]
                batch.step(tokens[keep], keep)
        batch.store_live_rows()
        for completion in completions:
            completion.stopped = completion.token_ids[-1] == self.eos_id
        return completions
