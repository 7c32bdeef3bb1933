"""Rollouts with vLLM, colocated with the trainer on the same GPU (`rollout=vllm`).

Needs `pip install -e ".[vllm]"` and a CUDA GPU. The engine runs in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so weights can be loaded straight into its model after
every update; log-probs are requested in `processed_logprobs` mode, i.e. under the
temperature / top-k / top-p distribution actually sampled from, as the HF engine reports them. A turn ends
on any of `minirl.inference.loop.end_of_turn_ids` (and on `SamplingParams.stop`, which vLLM takes).
"""

from __future__ import annotations

import os

from minirl.errors import ConfigError
from minirl.inference.loop import end_of_turn_ids
from minirl.rollout.engine import ENGINES, Completion, SamplingParams


@ENGINES.register("vllm")
class VLLMEngine:
    def __init__(self, model, tokenizer, device, model_path: str, gpu_memory_utilization: float = 0.4, **_: object):
        try:
            import vllm  # an optional extra, on CUDA only: imported when this engine is chosen
        except ImportError as err:
            raise ConfigError('rollout=vllm needs vLLM: pip install -e ".[vllm]"') from err
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._vllm = vllm
        self.end_ids = end_of_turn_ids(tokenizer, model)
        self.llm = vllm.LLM(
            model=model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
        )

    def sync_weights(self, model) -> None:
        runner_model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        runner_model.load_weights(model.state_dict().items())
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        sampling = self._vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            stop_token_ids=sorted(self.end_ids),
            stop=list(params.stop) or None,
            logprobs=0,  # the sampled token's log-prob only
            seed=params.seed,
        )
        requests = [{"prompt_token_ids": p} for p in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for out in outputs:
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, tokens)]
            completions.append(Completion(tokens, logprobs, stopped=sample.finish_reason == "stop"))
        return completions
