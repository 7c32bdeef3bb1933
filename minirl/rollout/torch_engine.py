"""Rollouts on the policy module itself (CPU or one GPU), through the decoding loop the server also runs
(`minirl.inference.loop.DecodeLoop`).

Unlike `generate`, which steps every row until the longest one ends, a row leaves the batch and the KV
cache as soon as it samples an end-of-turn token, so a batch whose turns are mostly short costs about its
mean length, not its longest. The keys and values of the rows a call finished are kept until the next
call, whose prompts continue those conversations: a turn's prefill encodes only the observation and the
template tokens appended since the last one (`minirl.inference.decoding.PrefixStore`). Every row draws
from the global torch RNG, the whole batch at once each step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from minirl.inference.decoding import PrefixStore
from minirl.inference.loop import DecodeLoop, RowRequest, StopReason
from minirl.rollout.engine import ENGINES, Completion, ModuleEngine, SamplingParams


@ENGINES.register("torch")
class TorchEngine(ModuleEngine):
    """Samples token by token on the trained module; finished rows leave the batch at once."""

    def __init__(self, model, tokenizer, device: torch.device, **kwargs: object) -> None:
        super().__init__(model, tokenizer, device, **kwargs)
        self.finished = PrefixStore()  # the last call's rows, for prompts that continue them

    def sync_weights(self, model) -> None:
        super().sync_weights(model)
        self.finished = PrefixStore()  # computed by the old weights

    def free_memory(self) -> None:
        self.finished = PrefixStore()  # the update changes the weights that computed them: free them now

    @contextmanager
    def session(self) -> Iterator[DecodeLoop]:
        """A decoding loop that rows join while others decode (the agent loop without a round barrier,
        minirl/rollout/agent_loop.py): a row's next turn encodes only what was appended since its last one,
        whose keys and values the loop kept when it left. The module is in eval mode, under no_grad."""
        store = PrefixStore(consume=True)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                yield DecodeLoop(self.model, self.pad_id, self.end_ids, reuse=store, store=store)
        finally:
            self.model.train(was_training)

    def sample(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        loop = DecodeLoop(self.model, self.pad_id, self.end_ids, reuse=self.finished, store=PrefixStore())
        self.finished = loop.store
        rows = loop.admit([RowRequest(prompt, params) for prompt in prompts])
        completions = {row: Completion([], [], False) for row in rows}
        while loop.rows:
            for sampled in loop.step():
                completion = completions[sampled.row]
                completion.token_ids.append(sampled.token)
                completion.logprobs.append(sampled.logprob)
                completion.stopped = sampled.stop is StopReason.stop
            loop.reuse = None  # every prompt is in the loop's cache now: free the last call's copies
        return [completions[row] for row in rows]
