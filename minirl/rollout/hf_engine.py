"""Rollouts with Hugging Face `generate` on the policy module itself (CPU or one GPU); a turn ends on any of
`minirl.inference.loop.end_of_turn_ids`, as in the other engines."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from minirl.inference.decoding import left_padded
from minirl.inference.sampling import is_greedy
from minirl.rollout.engine import ENGINES, Completion, ModuleEngine, SamplingParams


@ENGINES.register("hf")
class HFEngine(ModuleEngine):
    """Samples with `model.generate`; log-probs come from the processed scores, i.e. the
    distribution actually sampled from (after temperature, top-k and top-p)."""

    def sample(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        ids, attention = left_padded(prompts, self.pad_id)  # [B, P] each
        width = ids.shape[1]
        # explicit sampling values: None would fall back to generation defaults such as top_k=50
        sampling = {"do_sample": False} if is_greedy(params.temperature) else {
            "do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
        }  # fmt: skip
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            eos_token_id=sorted(self.end_ids),
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
            **sampling,
        )
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=attention.to(self.device), generation_config=config
        )
        new_tokens = out.sequences[:, width:].cpu()  # [B, T]
        scores = torch.stack(out.scores, dim=1).float().cpu()  # [B, T, V] processed logits
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)  # [B, T]
        completions = []
        for row in range(len(prompts)):
            tokens = new_tokens[row].tolist()
            ends = [i for i, token in enumerate(tokens) if token in self.end_ids]
            n = ends[0] + 1 if ends else len(tokens)  # generate pads a finished row to the longest
            completions.append(Completion(tokens[:n], logprobs[row, :n].tolist(), bool(ends)))
        return completions
