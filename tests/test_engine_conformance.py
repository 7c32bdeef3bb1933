"""The rollout engines' contract (minirl/rollout/engine.py), one suite for every engine in `ENGINES`: `torch`,
`hf` and `vllm`. Each test runs once per engine, on one engine per engine for the module. The vllm cases are
marked `vllm` and run in the vLLM CPU venv (`make test-vllm`, docs/vllm.md); where vLLM is not installed
they are skipped, and say so.

The model is a small Qwen2 with head size 32 (the smallest vLLM's CPU attention takes) that has memorised a
three-turn tool conversation and a greeting, saved with save_pretrained and loaded by path, as a checkpoint is.
Every engine is built as the trainer builds it (`build_engine`), from the same saved model.
"""

from __future__ import annotations

import copy
import gc
import importlib.util
import random
import time

import pytest
import torch
from support import CALC_TOOL, GREETING, Staggered, memorising_model, trajectory_view

from minirl.config import ProtocolConfig, RolloutConfig
from minirl.data.task import Task
from minirl.protocol.chat import render
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import SamplingParams, build_engine
from minirl.rollout.trajectory import TrajectoryEnd
from minirl.tools import ToolExecutor, build_tools
from minirl.training.batch import collate, token_logprobs

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = (
    "vLLM is not installed in this venv, so the conformance suite checks only the torch and hf engines here: "
    "`make test-vllm` runs its vllm cases in the vLLM CPU venv (docs/vllm.md)"
)
ENGINE_NAMES = [
    "torch",
    "hf",
    pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason=NO_VLLM)]),
]

# An engine's log-probs against the trainer's (fp32 on CPU), per engine: the sampled tokens' under every
# sampling setting, and a fixed sequence's after a weight sync. Measured maxima over this module's cases:
# torch 3.3e-6 and hf 2.9e-6 (the trainer's own forward, batched, padded and KV-cached differently), vllm
# 4.5e-6 (its own CPU kernels, whose reductions vary with the CPU and thread count: a wider margin).
LOGPROB_BOUND = {"torch": 2e-5, "hf": 2e-5, "vllm": 1e-4}
MOVED = 1e-2  # a gap at least this large: the other weights, or the unfiltered distribution


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
PROTOCOL = ProtocolConfig()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(model, tokenizer, path): the memorising model and where it is saved."""
    path = tmp_path_factory.mktemp("conformance_model")
    model, tokenizer = memorising_model(THREE_TURNS, path, num_heads=2)
    return model, tokenizer, path


@pytest.fixture(scope="module", params=ENGINE_NAMES)
def engine(request, policy):
    """One engine of each kind for the module, built as the trainer builds it; `engine.name` is its key."""
    model, tokenizer, path = policy
    config = RolloutConfig(engine=request.param, gpu_memory_utilization=0.2, max_total_tokens=1024, max_new_tokens=96)
    built = build_engine(config, model, tokenizer, torch.device("cpu"), str(path))
    built.name = request.param
    yield built
    if request.param == "vllm":  # free its KV cache before another module starts an engine of its own
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        del built.llm
        gc.collect()
        cleanup_dist_env_and_memory()


def executor() -> ToolExecutor:
    return ToolExecutor(build_tools(["calculate_math"]), timeout_s=2.0, max_output_chars=256)


def prompt_ids(tokenizer, messages, tools=None) -> list[int]:
    return render(tokenizer, messages, tools, add_generation_prompt=True)


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


@torch.no_grad()
def trainer_scores(model, ids: list[int]) -> torch.Tensor:  # [T - 1] log p(ids[t] | ids[:t]), raw softmax
    logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(dim=-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_three_tool_turns_keep_every_sampled_token(policy, engine):
    """Token-in/token-out through the real agent loop: the memorised conversation's three turns (two calls,
    then the answer), greedy. Each later prompt is the earlier prompt + its completion + the framework's
    closing and observation tokens; the trajectory is exactly the first prompt, then each turn's sampled tokens
    (mask 1, the engine's log-probs) and what the framework appended (mask 0, log-prob 0)."""
    model, tokenizer, _ = policy
    recording = Recording(engine)
    task = Task("three", QUESTION, [CALC_TOOL], ["20"])
    limits = AgentLimits(max_turns=3, max_new_tokens=96, max_total_tokens=1024, max_tool_calls=4)
    [traj] = run_agent(recording, tokenizer, executor(), [task], 1, limits, SamplingParams(96, 0.0), PROTOCOL)
    assert [len(turn.tool_results) for turn in traj.turns] == [1, 1, 0]
    assert [r.content for turn in traj.turns for r in turn.tool_results] == ['{"result": "5"}', '{"result": "20"}']
    assert traj.finish_reason is TrajectoryEnd.ANSWER and "20" in traj.turns[-1].text
    assert len(recording.calls) == 3
    prompts = [prompt for [prompt], _ in recording.calls]
    completions = [completion for _, [completion] in recording.calls]
    assert prompts[0] == traj.prompt_ids
    response, mask, logprobs = [], [], []
    for k, completion in enumerate(completions):
        assert completion.stopped and completion.token_ids[-1] in engine.end_ids
        response += completion.token_ids
        mask += [1] * len(completion.token_ids)
        logprobs += completion.logprobs
        if k + 1 < len(prompts):  # the next prompt continues this one: the sampled tokens, then the framework's
            sampled_end = len(prompts[k]) + len(completion.token_ids)
            assert prompts[k + 1][:sampled_end] == prompts[k] + completion.token_ids
            added = prompts[k + 1][sampled_end:]
            assert '{"result": ' in tokenizer.decode(added)
            response += added
            mask += [0] * len(added)
            logprobs += [0.0] * len(added)
    assert traj.response_ids == response and traj.action_mask == mask and traj.sampler_logprobs == logprobs
    # greedy: the log-probs are the raw distribution's, as the trainer scores them
    batch = collate([traj], torch.zeros(1), tokenizer.pad_token_id)
    gap = ((token_logprobs(model, batch, SamplingParams(1, 0.0)) - batch.old_logp).abs() * batch.mask).max()
    print(f"{engine.name} log-prob gap, greedy three turns: {gap.item():.1e}")
    assert gap.item() < LOGPROB_BOUND[engine.name]


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.8, 0.9, 0), (0.8, 1.0, 5), (0.8, 0.8, 40)]
)
def test_sampler_logprobs_equal_the_trainers(policy, engine, temperature, top_p, top_k):
    """The engine's log-prob of each sampled token is its log-prob under the distribution it was drawn from
    (temperature, then top-k and top-p, renormalised), as the trainer recomputes it
    (minirl.training.batch.token_logprobs); under top-k / top-p the unfiltered ones would differ."""
    model, tokenizer, _ = policy
    tasks = [Task("unseen", UNSEEN, [], []), Task("greeting", GREETING[:2], [], [])]
    limits = AgentLimits(max_turns=1, max_new_tokens=32, max_total_tokens=1024, max_tool_calls=4)
    sampling = SamplingParams(32, temperature, top_p, top_k, seed=3)
    trajs = run_agent(engine, tokenizer, executor(), tasks, 4, limits, sampling, PROTOCOL)
    batch = collate(trajs, torch.zeros(len(trajs)), tokenizer.pad_token_id)
    with torch.no_grad():
        filtered = token_logprobs(model, batch, SamplingParams(1, temperature, top_p, top_k))
        unfiltered = token_logprobs(model, batch, SamplingParams(1, temperature))
    gap = ((filtered - batch.old_logp).abs() * batch.mask).max().item()
    print(f"{engine.name} log-prob gap at T={temperature} top_p={top_p} top_k={top_k}: {gap:.1e}")
    assert batch.mask.sum() > 0 and gap < LOGPROB_BOUND[engine.name]
    if top_p < 1 or top_k > 0:
        assert ((unfiltered - batch.old_logp).abs() * batch.mask).max().item() > MOVED


def test_after_sync_weights_the_engine_scores_as_the_new_weights_do(policy, engine):
    """After `sync_weights` with perturbed weights, a fixed sequence's log-probs under the engine equal the
    trainer's for the new weights and clearly not the old ones'; so do the log-probs of what it samples next,
    continuing a conversation whose first turn the old weights sampled (no stale cache survives the sync).
    Syncing back restores the old scores."""
    model, tokenizer, _ = policy
    bound = LOGPROB_BOUND[engine.name]
    ids = render(tokenizer, GREETING, None, add_generation_prompt=False)[:40]
    assert max_gap(engine.score(ids), trainer_scores(model, ids)) < bound
    first_prompt = prompt_ids(tokenizer, UNSEEN)
    [first] = engine.generate([first_prompt], SamplingParams(16, 1.0, seed=1))  # cached under the old weights
    updated = copy.deepcopy(model)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for p in updated.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    start = time.perf_counter()
    engine.sync_weights(updated)
    print(f"{engine.name} sync_weights: {time.perf_counter() - start:.3f} s")
    try:
        scores = engine.score(ids)
        new_gap, old_gap = max_gap(scores, trainer_scores(updated, ids)), max_gap(scores, trainer_scores(model, ids))
        print(f"{engine.name} after sync: gap to the new weights {new_gap:.1e}, to the old {old_gap:.1e}")
        assert new_gap < bound and old_gap > MOVED
        observation = tokenizer.encode("<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n")
        continued = first_prompt + first.token_ids + observation + tokenizer.encode("<|im_start|>assistant\n")
        [sample] = engine.generate([continued], SamplingParams(16, 1.0, seed=2))
        sampled = torch.tensor(sample.logprobs)
        n = len(sample.token_ids)
        assert max_gap(sampled, trainer_scores(updated, continued + sample.token_ids)[-n:]) < bound
        assert max_gap(sampled, trainer_scores(model, continued + sample.token_ids)[-n:]) > MOVED
    finally:
        engine.sync_weights(model)
    assert max_gap(engine.score(ids), trainer_scores(model, ids)) < bound


def test_a_turn_ends_on_its_end_token_which_comes_back_or_at_max_new_tokens(policy, engine):
    """A turn that samples an end-of-turn id ends there, the id returned as its last token (`stopped`); one
    cut by max_new_tokens has exactly that many tokens, no end id, and is not `stopped`; an end id drawn as the
    last allowed token is a stop. The agent loop reads both: an answer, and a turn out of tokens."""
    _, tokenizer, _ = policy
    greeting = prompt_ids(tokenizer, GREETING[:2])
    [done] = engine.generate([greeting], SamplingParams(64, 0.0))
    assert done.stopped and done.token_ids[-1] in engine.end_ids
    assert not any(token in engine.end_ids for token in done.token_ids[:-1])
    assert len(done.logprobs) == len(done.token_ids) and "Hello!" in tokenizer.decode(done.token_ids)
    [cut] = engine.generate([greeting], SamplingParams(3, 0.0))
    assert not cut.stopped and cut.token_ids == done.token_ids[:3] and len(cut.logprobs) == 3
    assert max_gap(torch.tensor(cut.logprobs), torch.tensor(done.logprobs[:3])) < LOGPROB_BOUND[engine.name]
    [exact] = engine.generate([greeting], SamplingParams(len(done.token_ids), 0.0))
    assert exact.stopped and exact.token_ids == done.token_ids

    task = Task("greeting", GREETING[:2], [], ["Hello"])
    for max_new, finish in ((64, TrajectoryEnd.ANSWER), (3, TrajectoryEnd.TURN_TOKENS)):
        limits = AgentLimits(max_turns=2, max_new_tokens=max_new, max_total_tokens=1024, max_tool_calls=4)
        [traj] = run_agent(engine, tokenizer, executor(), [task], 1, limits, SamplingParams(max_new, 0.0), PROTOCOL)
        assert traj.finish_reason is finish and len(traj.turns) == 1
        assert traj.response_ids == done.token_ids[:max_new] and all(traj.action_mask)
        body = done.token_ids[:max_new]
        body = body[:-1] if body[-1] in engine.end_ids else body  # the end-of-turn id is not the turn's text
        assert traj.turns[0].text == tokenizer.decode(body, skip_special_tokens=False)


def test_seeds_reproduce_and_a_groups_samples_differ(policy, engine):
    """A seeded call repeats itself, and the identical prompts of one call (a group) draw different samples;
    another seed draws others. Unseeded, the global torch RNG decides, so the trainer's seed repeats a run."""
    _, tokenizer, _ = policy
    group = [prompt_ids(tokenizer, UNSEEN)] * 8
    params = SamplingParams(24, 1.0, seed=5)
    first = engine.generate(group, params)
    again = engine.generate(group, params)
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    assert max(max_gap(torch.tensor(a.logprobs), torch.tensor(b.logprobs)) for a, b in zip(first, again)) < 1e-6
    assert len({tuple(c.token_ids) for c in first}) > len(group) // 2  # a memorising model repeats itself at times
    other = engine.generate(group, SamplingParams(24, 1.0, seed=6))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]
    torch.manual_seed(0)
    unseeded = engine.generate(group, SamplingParams(24, 1.0))
    torch.manual_seed(0)
    assert [c.token_ids for c in engine.generate(group, SamplingParams(24, 1.0))] == [c.token_ids for c in unseeded]
    assert len({tuple(c.token_ids) for c in unseeded}) > len(group) // 2


def unbarriered(engine, tokenizer, tool, sampling: SamplingParams, barrier: bool, seed: int = 0):
    """Four trajectories of the three-turn task and four of the greeting, calls run by `tool` four at a time."""
    tasks = [Task("three", QUESTION, [CALC_TOOL], ["20"]), Task("greeting", GREETING[:2], [], [])]
    limits = AgentLimits(max_turns=3, max_new_tokens=64, max_total_tokens=1024, max_tool_calls=4)
    calls = ToolExecutor({"calculate_math": tool}, timeout_s=5.0, max_output_chars=256, max_concurrent=4)
    torch.manual_seed(seed)
    return run_agent(engine, tokenizer, calls, tasks, 4, limits, sampling, PROTOCOL, barrier=barrier)


def test_without_a_barrier_greedy_trajectories_are_the_barriers(policy, engine):
    """rollout.barrier=false (the torch engine's decoding loop, vLLM's own scheduler; hf keeps the barrier): a
    trajectory's next turn joins the batch as soon as its calls are back, and every token, mask, end and tool
    result is what the round-barrier schedule gives."""
    _, tokenizer, _ = policy
    greedy = SamplingParams(64, temperature=0.0)
    barrier = unbarriered(engine, tokenizer, Staggered(lambda i: 0.03 * (i % 3)), greedy, barrier=True)
    without = unbarriered(engine, tokenizer, Staggered(lambda i: 0.03 * (i % 3)), greedy, barrier=False)
    assert trajectory_view(without) == trajectory_view(barrier)
    assert sum(len(u.tool_results) for t in without for u in t.turns) == 8  # four trajectories of two calls
    gaps = [abs(x - y) for a, b in zip(without, barrier) for x, y in zip(a.sampler_logprobs, b.sampler_logprobs)]
    assert max(gaps) < LOGPROB_BOUND[engine.name]


def test_without_a_barrier_samples_repeat_whatever_the_tool_wall_clock(policy, engine):
    """Sampled without a barrier, each trajectory draws from its own generator (vLLM: its requests' seeds from
    it), so two rollouts whose calls take random, different times sample the same tokens; the sampler log-probs
    are the trainer's."""
    model, tokenizer, _ = policy
    sampling = SamplingParams(64, temperature=1.0)
    wall_clock = random.Random()  # unseeded on purpose: the two runs' timings differ
    first = unbarriered(engine, tokenizer, Staggered(lambda i: wall_clock.uniform(0, 0.05)), sampling, False)
    second = unbarriered(engine, tokenizer, Staggered(lambda i: wall_clock.uniform(0, 0.05)), sampling, False)
    assert trajectory_view(first) == trajectory_view(second)
    assert len({tuple(t.response_ids) for t in first}) > 2
    batch = collate(first, torch.zeros(len(first)), tokenizer.pad_token_id)
    with torch.no_grad():
        gap = ((token_logprobs(model, batch, SamplingParams(1, 1.0)) - batch.old_logp).abs() * batch.mask).max()
    assert batch.mask.sum() > 0 and gap.item() < LOGPROB_BOUND[engine.name]
