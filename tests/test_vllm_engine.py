"""The vLLM engine for real, on vLLM's CPU build (`make test-vllm`: the venv of `make vllm-env`, docs/vllm.md):
what only this engine has. What every engine must do (token-in/token-out across tool turns, sampler log-probs
equal to the trainer's, weight sync, end-of-turn handling, seeds) is tests/test_engine_conformance.py, which
runs it on vLLM too. Skipped where vLLM is not installed (the main venv). One engine for the module: it takes
~20-50 s to start.

The model is a small untrained Qwen2 (head size 32: the smallest the CPU attention kernels take), saved with
save_pretrained and loaded by path, as a checkpoint is.
"""

from __future__ import annotations

import time

import pytest
import torch

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in the vLLM CPU venv (docs/vllm.md)"
)

from support import CALC_TOOL, CONVERSATION, GREETING  # noqa: E402

from minirl.config import RolloutConfig, TinyModelConfig  # noqa: E402
from minirl.errors import ConfigError  # noqa: E402
from minirl.inference.loop import StopReason  # noqa: E402
from minirl.models.tiny import build_model, build_tokenizer, render_texts  # noqa: E402
from minirl.rollout.engine import ENGINES, SamplingParams  # noqa: E402
from minirl.rollout.vllm_engine import sample_seed, stop_reason  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(model, tokenizer, path): an untrained model and where it is saved."""
    cfg = TinyModelConfig(vocab_size=400, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    tokenizer = build_tokenizer(cfg, render_texts([(CONVERSATION, [CALC_TOOL]), (GREETING, [])] * 20))
    model = build_model(cfg, tokenizer).eval()
    path = tmp_path_factory.mktemp("vllm_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer, path


@pytest.fixture(scope="module")
def engine(policy):
    """One vLLM engine for the module, started as the trainer starts it; `engine.start_s` and
    `engine.rng_kept` (the global torch RNG draws after its start what it would have drawn without it)."""
    model, tokenizer, path = policy
    config = RolloutConfig(engine="vllm", gpu_memory_utilization=0.2, max_total_tokens=1024, max_new_tokens=96)
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    start = time.perf_counter()
    built = ENGINES.get("vllm")(model, tokenizer, torch.device("cpu"), model_path=str(path), config=config)
    built.start_s = time.perf_counter() - start
    built.rng_kept = torch.equal(torch.rand(4), expected)
    print(f"vLLM engine start: {built.start_s:.1f} s")
    return built


def test_engine_starts_with_the_configured_context_and_leaves_the_trainers_rng_alone(engine):
    assert engine.llm.llm_engine.vllm_config.model_config.max_model_len == 1024 + 96
    assert engine.rng_kept  # vLLM's worker reseeds the global RNGs when it starts
    assert engine.start_s < 300


def test_a_budget_longer_than_the_models_context_is_refused_before_the_engine_starts(policy):
    """vLLM caps its context at the model's positions: a conversation allowed to grow past them would be refused
    or cut there, where the torch engine samples on."""
    model, tokenizer, path = policy
    config = RolloutConfig(engine="vllm", max_total_tokens=model.config.max_position_embeddings + 1)
    with pytest.raises(ConfigError, match=r"rollout=vllm: the model's context \(max_position_embeddings 2048\)"):
        ENGINES.get("vllm")(model, tokenizer, torch.device("cpu"), model_path=str(path), config=config)


def test_sample_seeds_differ_within_a_call_and_across_nearby_seeds():
    """sample_seed(seed, i), the seed of sample i of a call seeded `seed`: never `seed + i`, whose streams a
    neighbouring seed's call would repeat shifted by one."""
    assert len({sample_seed(seed, i) for seed in range(50) for i in range(64)}) == 50 * 64


@pytest.mark.parametrize("reason", ["abort", "error", "repetition"])
def test_a_request_ended_otherwise_than_by_a_stop_or_its_budget_raises(reason):
    """vLLM's finish reasons besides "stop" and "length" (an internal error, say) are no turn to train on: they
    raise, where the engine once passed them off as a turn cut at its token budget."""
    assert stop_reason("stop", "0") is StopReason.stop
    assert stop_reason("length", "0") is StopReason.length
    with pytest.raises(RuntimeError, match=f"vLLM ended request 7 with finish_reason '{reason}'"):
        stop_reason(reason, "7")


def test_sampling_a_batch_larger_than_one_prefill_step_works_and_reproduces(engine, policy):
    """More prompt tokens than one scheduler step takes (max_num_batched_tokens): on CPU vLLM would split a
    prefill across steps and then rewind a seeded request's generator, which the CPU generator cannot do
    ("CPU Generator does not use offset"); the engine turns chunked prefill off there."""
    _, tokenizer, _ = policy
    budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    count = budget // 300 + 4  # more prompt tokens than one step's budget, none of them cached
    prompts = [tokenizer.encode(f"What is {i} + 3? " * 60)[:300] for i in range(count)]
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=5)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) > 1
