"""The vLLM engine for real, on vLLM's CPU build (`make test-vllm`: the venv of `make vllm-env`, docs/vllm.md).
Skipped where vLLM is not installed (the main venv). One engine for the module: it takes ~20-50 s to start.

The model is a small Qwen2 (head size 32: the smallest the CPU attention kernels take) that has memorised a
three-turn tool conversation and a greeting, saved with save_pretrained and loaded by path, as a checkpoint is.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in the vLLM CPU venv (docs/vllm.md)"
)

from support import CALC_TOOL, GREETING  # noqa: E402

from minirl.config import ProtocolConfig, RolloutConfig, SFTConfig, TinyModelConfig  # noqa: E402
from minirl.data.task import Task  # noqa: E402
from minirl.models.tiny import build_model, build_tokenizer, render_texts  # noqa: E402
from minirl.protocol.chat import render  # noqa: E402
from minirl.rollout.agent_loop import AgentLimits, run_agent  # noqa: E402
from minirl.rollout.engine import ENGINES, SamplingParams  # noqa: E402
from minirl.rollout.trajectory import TrajectoryEnd  # noqa: E402
from minirl.rollout.vllm_engine import sample_seed  # noqa: E402
from minirl.tools import ToolExecutor, build_tools  # noqa: E402
from minirl.training.batch import collate, token_logprobs  # noqa: E402
from minirl.training.sft import tokenize_conversation, train_sft  # noqa: E402

pytestmark = pytest.mark.vllm

# the engine's log-probs against the trainer's (fp32 on CPU); measured: <= 1e-6
LOGPROB_BOUND = 1e-4


def call(expression: str) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculate_math", "arguments": {"expression": expression}}}
        ],
    }


QUESTION = [{"role": "user", "content": "What is 2 + 3, and that times 4?"}]
THREE_TURNS = [
    *QUESTION,
    call("2 + 3"),
    {"role": "tool", "name": "calculate_math", "content": '{"result": "5"}'},
    call("5 * 4"),
    {"role": "tool", "name": "calculate_math", "content": '{"result": "20"}'},
    {"role": "assistant", "content": "2 + 3 = 5, and 5 * 4 = 20."},
]
UNSEEN = [{"role": "user", "content": "Tell me about the weather in Oslo, briefly."}]  # broad distributions


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(model, tokenizer, path): the memorising model and where it is saved."""
    cfg = TinyModelConfig(vocab_size=400, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    tokenizer = build_tokenizer(cfg, render_texts([(THREE_TURNS, [CALC_TOOL]), (GREETING, [])] * 20))
    model = build_model(cfg, tokenizer)
    examples = [
        tokenize_conversation(tokenizer, THREE_TURNS, [CALC_TOOL]),
        tokenize_conversation(tokenizer, GREETING, None),
    ]
    train_sft(
        model,
        tokenizer,
        examples * 4,
        SFTConfig(epochs=100, batch_size=8, lr=5e-3, warmup_steps=10),
        torch.device("cpu"),
    )
    model.eval()
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


class Recording:
    """The engine, with every call's prompts and completions kept."""

    def __init__(self, engine) -> None:
        self.engine, self.end_ids, self.calls = engine, engine.end_ids, []

    def generate(self, prompts, params):
        out = self.engine.generate(prompts, params)
        self.calls.append(([list(p) for p in prompts], out))
        return out

    def sync_weights(self, model) -> None:
        self.engine.sync_weights(model)


def executor() -> ToolExecutor:
    return ToolExecutor(build_tools(["calculate_math"]), timeout_s=2.0, max_output_chars=256)


def prompt_ids(tokenizer, messages, tools=None) -> list[int]:
    return render(tokenizer, messages, tools, add_generation_prompt=True)


def engine_scores(engine, ids: list[int]) -> torch.Tensor:  # [T - 1] the engine's log p(ids[t] | ids[:t])
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    [out] = engine.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    return torch.tensor([step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:])])


@torch.no_grad()
def trainer_scores(model, ids: list[int]) -> torch.Tensor:  # [T - 1]
    logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(dim=-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def test_engine_starts_with_the_configured_context_and_leaves_the_trainers_rng_alone(engine):
    assert engine.llm.llm_engine.vllm_config.model_config.max_model_len == 1024 + 96
    assert engine.rng_kept  # vLLM's worker reseeds the global RNGs when it starts
    assert engine.start_s < 300


def test_three_tool_turns_keep_every_sampled_token(policy, engine):
    """Token-in/token-out through vLLM: the memorised conversation's three turns (two calls, then the answer),
    greedy; each later prompt is the earlier prompt + its completion + closing and observation tokens, and the
    trajectory's action tokens and sampler log-probs are exactly what the engine returned."""
    model, tokenizer, _ = policy
    recording = Recording(engine)
    task = Task("three", QUESTION, [CALC_TOOL], ["20"])
    limits = AgentLimits(max_turns=3, max_new_tokens=96, max_total_tokens=1024, max_tool_calls=4)
    [traj] = run_agent(recording, tokenizer, executor(), [task], 1, limits, SamplingParams(96, 0.0), ProtocolConfig())
    assert [len(turn.tool_results) for turn in traj.turns] == [1, 1, 0]
    assert [r.content for turn in traj.turns for r in turn.tool_results] == ['{"result": "5"}', '{"result": "20"}']
    assert traj.finish_reason is TrajectoryEnd.ANSWER and "20" in traj.turns[-1].text
    assert len(recording.calls) == 3
    sampled = [c.token_ids for _, [c] in recording.calls]
    for (prompt, [completion]), (later, _) in zip(recording.calls, recording.calls[1:]):
        assert later[0][: len(prompt[0]) + len(completion.token_ids)] == prompt[0] + completion.token_ids
    actions = [token for token, m in zip(traj.response_ids, traj.action_mask) if m]
    assert actions == [token for turn in sampled for token in turn]
    logprobs = [lp for lp, m in zip(traj.sampler_logprobs, traj.action_mask) if m]
    assert logprobs == [lp for _, [c] in recording.calls for lp in c.logprobs]
    assert traj.prompt_ids + traj.response_ids == recording.calls[-1][0][0] + sampled[-1]
    # greedy: the log-probs are the raw distribution's, as the trainer scores them
    batch = collate([traj], torch.zeros(1), tokenizer.pad_token_id)
    gap = ((token_logprobs(model, batch, SamplingParams(1, 0.0)) - batch.old_logp).abs() * batch.mask).max()
    assert gap.item() < LOGPROB_BOUND


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.8, 0.9, 0), (0.8, 1.0, 5), (0.8, 0.8, 40)]
)
def test_sampler_logprobs_equal_the_trainers(policy, engine, temperature, top_p, top_k):
    """vLLM's processed log-probs are of the distribution it drew from (temperature, then top-k and top-p,
    renormalised), as the trainer recomputes them; under top-k / top-p the unfiltered ones would differ."""
    model, tokenizer, _ = policy
    tasks = [Task("unseen", UNSEEN, [], []), Task("greeting", GREETING[:2], [], [])]
    limits = AgentLimits(max_turns=1, max_new_tokens=32, max_total_tokens=1024, max_tool_calls=4)
    sampling = SamplingParams(32, temperature, top_p, top_k, seed=3)
    trajs = run_agent(engine, tokenizer, executor(), tasks, 4, limits, sampling, ProtocolConfig())
    batch = collate(trajs, torch.zeros(len(trajs)), tokenizer.pad_token_id)
    with torch.no_grad():
        filtered = token_logprobs(model, batch, SamplingParams(1, temperature, top_p, top_k))
        unfiltered = token_logprobs(model, batch, SamplingParams(1, temperature))
    gap = ((filtered - batch.old_logp).abs() * batch.mask).max().item()
    print(f"vllm log-prob gap at T={temperature} top_p={top_p} top_k={top_k}: {gap:.2e}")
    assert batch.mask.sum() > 0 and gap < LOGPROB_BOUND
    if top_p < 1 or top_k > 0:
        assert ((unfiltered - batch.old_logp).abs() * batch.mask).max().item() > 1e-2


def test_a_turn_ends_on_its_end_token_which_comes_back_or_at_max_new_tokens(policy, engine):
    _, tokenizer, _ = policy
    greeting = prompt_ids(tokenizer, GREETING[:2])
    [done] = engine.generate([greeting], SamplingParams(64, 0.0))
    assert done.stopped and done.token_ids[-1] in engine.end_ids
    assert not any(token in engine.end_ids for token in done.token_ids[:-1])
    assert "Hello!" in tokenizer.decode(done.token_ids)
    [cut] = engine.generate([greeting], SamplingParams(3, 0.0))
    assert not cut.stopped and cut.token_ids == done.token_ids[:3] and len(cut.logprobs) == 3


def test_seeds_reproduce_and_a_groups_samples_differ(policy, engine):
    """One seed per sample (sample_seed(seed, i)): a seeded call repeats itself, its identical prompts differ;
    unseeded, the seeds come from the global torch RNG, so the trainer's seed makes a run repeat."""
    _, tokenizer, _ = policy
    group = [prompt_ids(tokenizer, UNSEEN)] * 8
    params = SamplingParams(24, 1.0, seed=5)
    first = engine.generate(group, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in engine.generate(group, params)]
    assert [c.logprobs for c in first] == [c.logprobs for c in engine.generate(group, params)]
    assert len({tuple(c.token_ids) for c in first}) > len(group) // 2  # a memorising model repeats itself at times
    other = engine.generate(group, SamplingParams(24, 1.0, seed=6))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]
    torch.manual_seed(0)
    unseeded = engine.generate(group, SamplingParams(24, 1.0))
    torch.manual_seed(0)
    assert [c.token_ids for c in engine.generate(group, SamplingParams(24, 1.0))] == [c.token_ids for c in unseeded]
    assert len({sample_seed(seed, i) for seed in range(50) for i in range(64)}) == 50 * 64


def test_after_sync_weights_the_engine_scores_as_the_new_weights_do(policy, engine):
    """A fixed sequence's log-probs under the engine (vLLM's prompt log-probs) equal the trainer's for the
    weights last synced, and are clearly not the previous weights'; syncing back restores them."""
    model, tokenizer, _ = policy
    ids = render(tokenizer, GREETING, None, add_generation_prompt=False)[:40]
    assert (engine_scores(engine, ids) - trainer_scores(model, ids)).abs().max().item() < LOGPROB_BOUND
    updated = copy.deepcopy(model)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for p in updated.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    start = time.perf_counter()
    engine.sync_weights(updated)
    print(f"vllm sync_weights: {time.perf_counter() - start:.3f} s")
    scores = engine_scores(engine, ids)
    new_gap = (scores - trainer_scores(updated, ids)).abs().max().item()
    old_gap = (scores - trainer_scores(model, ids)).abs().max().item()
    print(f"vllm after sync: gap to new weights {new_gap:.2e}, to old {old_gap:.2e}")
    assert new_gap < LOGPROB_BOUND and old_gap > 1e-2
    # sampling moved too: sampled tokens' log-probs are the new weights'
    [sample] = engine.generate([prompt_ids(tokenizer, UNSEEN)], SamplingParams(16, 1.0, seed=1))
    sampled = prompt_ids(tokenizer, UNSEEN) + sample.token_ids
    expected = trainer_scores(updated, sampled)[-len(sample.token_ids) :]
    assert (torch.tensor(sample.logprobs) - expected).abs().max().item() < LOGPROB_BOUND
    engine.sync_weights(model)
    assert (engine_scores(engine, ids) - trainer_scores(model, ids)).abs().max().item() < LOGPROB_BOUND
