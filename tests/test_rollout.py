"""The multi-turn agent loop with the real tokenizer, real tools and a scripted engine; the engines'
log-probs against the trainer's; the torch engine's draws, pinned to the batched global-RNG draw it has
always made; the end-of-turn rule in the engines."""

from __future__ import annotations

import json

import pytest
import torch
from support import CALC_TOOL, CONVERSATION, GREETING, ScriptedEngine, third_party_template
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.config import CallPolicy, ObservationCut, ProtocolConfig, SandboxConfig, ToolsConfig
from minirl.data.synthetic_tools import train_heldout_split
from minirl.data.task import Task
from minirl.inference.decoding import CachedBatch, PrefixStore
from minirl.inference.sampling import draw, warped
from minirl.protocol.chat import render
from minirl.protocol.parsing import TurnKind
from minirl.rollout.agent_loop import AgentLimits, replay_reference, run_agent
from minirl.rollout.engine import ENGINES, SamplingParams
from minirl.rollout.trajectory import TrajectoryEnd
from minirl.tools import ToolExecutor, build_tools
from minirl.tools.minimind import MINIMIND_TOOL_NAMES
from minirl.training.batch import collate, token_logprobs
from minirl.training.sft import tokenize_conversation

SAMPLING = SamplingParams(max_new_tokens=256)
HERMES = ProtocolConfig()
QWEN3_CODER = ProtocolConfig(format="qwen3_coder", call_policy=CallPolicy.strict_single, max_calls_per_turn=1)


def weather_call(city: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'get_current_weather', 'arguments': {'city': city}})}\n</tool_call>"


@pytest.fixture
def tasks():
    _, heldout = train_heldout_split(50, 12, seed=3)
    return heldout[:3]


@pytest.fixture
def executor():
    return ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=2.0, max_output_chars=512)


def run(
    tokenizer, executor, tasks, script, group_size=2, max_turns=3, stop=True, max_total=2048, protocol=HERMES,
    return_eos=True, max_calls=8,
):  # fmt: skip
    engine = ScriptedEngine(tokenizer, script, stop=stop, return_eos=return_eos)
    limits = AgentLimits(
        max_turns=max_turns,
        max_new_tokens=SAMPLING.max_new_tokens,
        max_total_tokens=max_total,
        max_tool_calls=max_calls,
    )
    return run_agent(engine, tokenizer, executor, tasks, group_size, limits, SAMPLING, protocol), engine


def test_calls_past_the_trajectory_budget_are_not_run_and_the_model_is_told(tokenizer, executor, tasks):
    two_calls = weather_call("Paris") + weather_call("Oslo")
    script = [two_calls, weather_call("Tokyo"), "It is sunny."]
    trajs, _ = run(tokenizer, executor, tasks, script, max_calls=3)
    for t in trajs:
        assert t.finish_reason is TrajectoryEnd.ANSWER
        statuses = [r.status for turn in t.turns for r in turn.tool_results]
        assert len(statuses) == 3 and "over_budget" not in statuses
    trajs, _ = run(tokenizer, executor, tasks, script, max_calls=1)
    for t in trajs:
        first, second = (turn.tool_results for turn in t.turns[:2])
        assert [r.status == "over_budget" for r in first] == [False, True]
        assert [r.status for r in second] == ["over_budget"]
        assert "budget" in second[0].content and "Tokyo" not in second[0].content
        assert t.finish_reason is TrajectoryEnd.ANSWER  # the conversation goes on; the model can answer


def test_three_turns_keep_sampled_tokens_mask_and_logprobs(tokenizer, executor, tasks):
    script = [weather_call("Paris"), weather_call("Tokyo"), "It is sunny."]
    trajs, engine = run(tokenizer, executor, tasks, script)
    assert engine.calls == 3
    for t in trajs:
        assert t.finish_reason is TrajectoryEnd.ANSWER and len(t.turns) == 3
        assert len(t.response_ids) == len(t.action_mask) == len(t.sampler_logprobs)
        full = t.prompt_ids + t.response_ids
        # each turn's prompt was exactly the conversation so far: token in, token out
        for k in range(3):
            prompt = next(p for p in engine.prompts[k] if p[: len(t.prompt_ids)] == t.prompt_ids)
            assert full[: len(prompt)] == prompt
        # masked-in tokens are exactly the sampled ones, with their own log-probs, in order
        sampled = [tok for tok, m in zip(t.response_ids, t.action_mask) if m]
        expected = []
        for text in script:
            expected += tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert sampled == expected
        row_logprobs = [lp for lp, m in zip(t.sampler_logprobs, t.action_mask) if m]
        assert all(lp < 0 for lp in row_logprobs)
        # observation tokens: mask 0, log-prob 0.0, and they hold the tool's real result
        observed = [tok for tok, m in zip(t.response_ids, t.action_mask) if not m]
        assert all(lp == 0.0 for lp, m in zip(t.sampler_logprobs, t.action_mask) if not m)
        text = tokenizer.decode(observed)
        results = [r for turn in t.turns[:2] for r in turn.tool_results]
        assert len(results) == 2 and text.count("<tool_response>") == 2
        assert all(r.content in text for r in results)


def test_a_replayed_reference_is_the_sft_conversation_with_the_assistant_tokens_as_actions(tokenizer, executor):
    train, _ = train_heldout_split(50, 12, seed=3)
    limits = AgentLimits(max_turns=3, max_new_tokens=256, max_total_tokens=2048, max_tool_calls=8)
    for kind in ("single", "double", "no_tool"):
        task = next(t for t in train if t.kind == kind and t.gt)
        traj = replay_reference(task, 5, tokenizer, executor, limits, HERMES)
        assert traj.off_policy and traj.group_index == 5 and traj.finish_reason is TrajectoryEnd.ANSWER
        assert traj.num_tool_calls == task.expected_tool_calls
        # token for token what the warm start trains on, the same tokens masked in as actions
        sft = tokenize_conversation(tokenizer, task.conversation, task.tools)
        ids, end = traj.prompt_ids + traj.response_ids, len(traj.prompt_ids) + len(traj.response_ids)
        assert ids == sft.input_ids[:end] and not any(sft.loss_mask[end:])  # the template's closing newline
        assert traj.action_mask == sft.loss_mask[len(traj.prompt_ids) : end]
        assert traj.sampler_logprobs == [0.0] * len(traj.response_ids)  # no sampler drew it
        assert traj.final_text == task.reference[-1]["content"] and all(v in traj.final_text for v in task.gt)


def test_groups_are_contiguous(tokenizer, executor, tasks):
    trajs, _ = run(tokenizer, executor, tasks, ["Paris."], group_size=4)
    assert [t.group_index for t in trajs] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(t.task is tasks[t.group_index] for t in trajs)
    assert all(t.prompt_ids == render(tokenizer, t.task.messages, t.task.tools, True) for t in trajs)


def test_sampler_without_end_of_turn_token_ends_the_turn_by_token_limit(tokenizer, executor, tasks):
    trajs, _ = run(tokenizer, executor, tasks, ["no end token here"], stop=False)
    assert {t.finish_reason for t in trajs} == {TrajectoryEnd.TURN_TOKENS}


def test_tool_call_on_the_last_turn_is_unfinished(tokenizer, executor, tasks):
    trajs, engine = run(tokenizer, executor, tasks, [weather_call("Paris")] * 2, max_turns=2)
    assert engine.calls == 2
    assert {t.finish_reason for t in trajs} == {TrajectoryEnd.MAX_TURNS}
    assert all(len(t.turns) == 2 and t.turns[-1].tool_results for t in trajs)


def test_malformed_call_is_invalid_and_runs_no_tool(tokenizer, executor, tasks):
    trajs, engine = run(tokenizer, executor, tasks, ["<tool_call>\n{broken\n</tool_call>"])
    assert engine.calls == 1
    assert {t.finish_reason for t in trajs} == {TrajectoryEnd.INVALID}
    assert all(not t.turns[0].tool_results for t in trajs)


def test_token_budget_ends_the_trajectory(tokenizer, executor, tasks):
    prompt = len(render(tokenizer, tasks[0].messages, tasks[0].tools, True))
    trajs, _ = run(tokenizer, executor, tasks[:1], [weather_call("Paris")] * 3, max_total=prompt + 5)
    assert {t.finish_reason for t in trajs} == {TrajectoryEnd.TOKEN_BUDGET}
    assert all(len(t.response_ids) == 5 and sum(t.action_mask) == 5 for t in trajs)


def test_a_first_prompt_that_fills_the_token_budget_samples_nothing(tokenizer, executor, tasks):
    """Such a prompt is never sent (an engine whose context is max_total_tokens + max_new_tokens, vLLM's, would
    refuse it); its trajectories end at once, with no response tokens."""
    prompt = len(render(tokenizer, tasks[0].messages, tasks[0].tools, True))
    trajs, engine = run(tokenizer, executor, tasks[:1], ["It is sunny."], max_total=prompt)
    assert engine.calls == 0
    assert [t.finish_reason for t in trajs] == [TrajectoryEnd.TOKEN_BUDGET] * 2
    assert all(not t.response_ids and not t.turns for t in trajs)


def test_unknown_tool_becomes_an_error_observation_and_the_run_goes_on(tokenizer, executor, tasks):
    bad = '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'
    trajs, _ = run(tokenizer, executor, tasks, [bad, "Sorry."])
    for t in trajs:
        assert t.finish_reason is TrajectoryEnd.ANSWER
        result = t.turns[0].tool_results[0]
        assert result.status == "unknown_tool" and "launch_rockets" in result.content


def observed_text(tokenizer, traj) -> str:
    """Everything the framework added to the conversation (mask 0), decoded."""
    return tokenizer.decode([tok for tok, m in zip(traj.response_ids, traj.action_mask) if not m])


def test_sampler_that_ends_the_turn_without_returning_the_end_token(tokenizer, executor, tasks):
    script = [weather_call("Paris"), "It is sunny."]
    trajs, engine = run(tokenizer, executor, tasks, script, return_eos=False)
    first = tokenizer.encode(script[0], add_special_tokens=False)
    for t in trajs:
        assert t.finish_reason is TrajectoryEnd.ANSWER and t.turns[0].parsed.kind is TurnKind.TOOL
        sampled = [tok for tok, m in zip(t.response_ids, t.action_mask) if m]
        assert sampled == first + tokenizer.encode(script[1], add_special_tokens=False)
        # the framework closed the assistant turn itself, with mask 0
        assert t.response_ids[len(first)] == tokenizer.eos_token_id and t.action_mask[len(first)] == 0
        second_prompt = engine.prompts[1][trajs.index(t)]
        assert (t.prompt_ids + t.response_ids)[: len(second_prompt)] == second_prompt


@pytest.fixture
def coder_tokenizer(tokenizer):
    """The real tokenizer under the Qwen3-Coder template (XML tool calls)."""
    original, tokenizer.chat_template = tokenizer.chat_template, third_party_template("qwen3_coder.jinja")
    yield tokenizer
    tokenizer.chat_template = original


XML_CONVERT = (
    "<tool_call>\n<function=unit_converter>\n<parameter=value>\n5\n</parameter>\n"
    "<parameter=from_unit>\nkm\n</parameter>\n<parameter=to_unit>\nm\n</parameter>\n</function>\n</tool_call>"
)


def convert_task() -> Task:
    schema = build_tools(["unit_converter"])["unit_converter"].schema()
    return Task(id="km", messages=[{"role": "user", "content": "How many m is 5 km?"}], tools=[schema], gt=["5000"])


def test_qwen3_coder_calls_run_end_to_end(coder_tokenizer, executor):
    script = [XML_CONVERT, "5 km is 5000 m."]
    trajs, engine = run(coder_tokenizer, executor, [convert_task()], script, protocol=QWEN3_CODER)
    assert engine.calls == 2
    for t in trajs:
        assert t.finish_reason is TrajectoryEnd.ANSWER
        [result] = t.turns[0].tool_results
        assert result.status == "ok" and "5000" in result.content  # the schema's number arrived as a number
        observed = observed_text(coder_tokenizer, t)
        assert "<tool_response>" in observed and result.content in observed


@pytest.mark.parametrize("turn", [XML_CONVERT * 2, XML_CONVERT + "\n5 km is 5000 m."], ids=["two_calls", "text_after"])
def test_strict_single_policy_ends_the_trajectory_without_running_a_tool(coder_tokenizer, executor, turn):
    trajs, engine = run(coder_tokenizer, executor, [convert_task()], [turn, "unused"], protocol=QWEN3_CODER)
    assert engine.calls == 1
    assert {t.finish_reason for t in trajs} == {TrajectoryEnd.INVALID}
    assert all(not t.turns[0].tool_results for t in trajs)


# renders what a tool message carries besides its content
TOOL_ID_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'tool' %}[{{ m.tool_call_id }} {{ m.name }}] {% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tool_messages_carry_the_call_id_and_tool_name(tokenizer, executor, tasks):
    script = [weather_call("Paris") + weather_call("Tokyo"), weather_call("Oslo"), "Done."]
    original, tokenizer.chat_template = tokenizer.chat_template, TOOL_ID_TEMPLATE
    try:
        [t], _ = run(tokenizer, executor, tasks[:1], script, group_size=1)
        observed = observed_text(tokenizer, t)
    finally:
        tokenizer.chat_template = original
    ids = [c.id for turn in t.turns for c in turn.parsed.tool_calls]
    assert ids == ["call_0_0", "call_0_1", "call_1_0"]  # unique within the trajectory
    assert [r.call_id for turn in t.turns for r in turn.tool_results] == ids
    assert all(f"[{call_id} get_current_weather]" in observed for call_id in ids)


@pytest.mark.parametrize("cut", list(ObservationCut))
def test_tool_output_enters_the_context_cut_to_its_token_budget(tokenizer, executor, tasks, cut):
    protocol = ProtocolConfig(max_tool_output_tokens=4, observation_cut=cut)
    trajs, _ = run(tokenizer, executor, tasks, [weather_call("Paris"), "Sunny."], protocol=protocol)
    for t in trajs:
        [result] = t.turns[0].tool_results
        observed = observed_text(tokenizer, t)
        ids = tokenizer.encode(result.content, add_special_tokens=False)
        start, end, marker = tokenizer.decode(ids[:4]), tokenizer.decode(ids[-4:]), f"[truncated {len(ids) - 4} tokens]"
        middle = tokenizer.decode(ids[:2]), tokenizer.decode(ids[-2:])
        expected = {
            ObservationCut.head: f"{start}\n...{marker}",
            ObservationCut.tail: f"...{marker}...\n{end}",
            ObservationCut.head_tail: f"{middle[0]}\n...{marker}...\n{middle[1]}",
        }
        assert expected[cut] in observed and result.content not in observed


def code_task() -> tuple[Task, ToolExecutor]:
    """A task that offers the real sandboxed code_interpreter, and an executor that runs it."""
    cfg = ToolsConfig(names=["code_interpreter"], timeout_s=5.0, sandbox=SandboxConfig(allow_unconfined=True))
    tools = build_tools(cfg.names, cfg)
    messages = [{"role": "user", "content": "Print the rows."}]
    task = Task(id="rows", messages=messages, tools=[tools["code_interpreter"].schema()], gt=["row249"])
    return task, ToolExecutor(tools, cfg.timeout_s, cfg.max_output_chars)


PRINT_ROWS = {"name": "code_interpreter", "arguments": {"code": "print(*(f'row{i}' for i in range(250)))"}}
CALL = f"<tool_call>\n{json.dumps(PRINT_ROWS)}\n</tool_call>"


@pytest.mark.parametrize("room", [16, 40])
def test_observations_shrink_so_that_the_next_prompt_leaves_room_to_sample(tokenizer, room):
    """A next prompt that would leave fewer than protocol.min_sample_room tokens of the budget gets its
    observation cut further, keeping both ends, to the largest cap that leaves them; the trajectory goes on."""
    task, executor = code_task()
    first = len(render(tokenizer, task.messages, task.tools, True)) + len(ScriptedEngine(tokenizer, []).turn_ids(CALL))
    max_total = first + 120  # the whole observation (512 tokens) is far over; about 80 of them fit
    protocol = ProtocolConfig(min_sample_room=room)
    trajs, engine = run(tokenizer, executor, [task], [CALL, "Done."], max_total=max_total, protocol=protocol)
    assert engine.calls == 2
    for t, prompt in zip(trajs, engine.prompts[1]):
        assert t.finish_reason is TrajectoryEnd.ANSWER
        assert max_total - room - 4 <= len(prompt) <= max_total - room  # as much as fits, not less
        observed = observed_text(tokenizer, t)
        assert "row0 row1" in observed and "row248 row249" in observed and "tokens]..." in observed
        assert len(t.prompt_ids) + len(t.response_ids) <= max_total


def test_observations_that_cannot_leave_room_end_the_trajectory(tokenizer):
    task, executor = code_task()
    first = len(render(tokenizer, task.messages, task.tools, True)) + len(ScriptedEngine(tokenizer, []).turn_ids(CALL))
    # 20 tokens after the call: less than the tool message's frame, a marker and the room to sample
    trajs, engine = run(tokenizer, executor, [task], [CALL, "Done."], max_total=first + 20)
    assert engine.calls == 1
    assert {t.finish_reason for t in trajs} == {TrajectoryEnd.TOKEN_BUDGET}
    assert all(t.action_mask == [1] * len(t.response_ids) for t in trajs)  # no observation was appended


@pytest.mark.parametrize("engine_name", ["hf", "torch"])
def test_engine_logprobs_match_the_trainer(tiny_policy, engine_name):
    """Sampler log-probs (HF generate's scores, the torch loop's own) and the trainer's recomputation agree
    to ~1e-5."""
    model, tokenizer, tasks = tiny_policy
    engine = ENGINES.get(engine_name)(model, tokenizer, torch.device("cpu"))
    executor = ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=2.0, max_output_chars=512)
    limits = AgentLimits(max_turns=2, max_new_tokens=24, max_total_tokens=1024, max_tool_calls=8)
    for temperature in (1.0, 0.7):
        torch.manual_seed(0)
        trajs = run_agent(engine, tokenizer, executor, tasks[:4], 2, limits, SamplingParams(24, temperature), HERMES)
        batch = collate(trajs, torch.zeros(len(trajs)), tokenizer.pad_token_id)
        with torch.no_grad():
            logp = token_logprobs(model, batch, SamplingParams(1, temperature))
        gap = ((logp - batch.old_logp).abs() * batch.mask).max().item()
        assert batch.mask.sum() > 0
        assert gap < 1e-4, gap


@pytest.mark.parametrize("engine_name", ["hf", "torch"])
@pytest.mark.parametrize(("top_p", "top_k"), [(0.9, 0), (1.0, 20), (0.8, 40)])
def test_engine_logprobs_match_the_trainer_under_top_p_and_top_k(tiny_policy, engine_name, top_p, top_k):
    """Under top-p / top-k the sampler reports log-probs renormalised over the tokens it could draw; the
    trainer applies the same filter, and without it the two would disagree."""
    model, tokenizer, tasks = tiny_policy
    engine = ENGINES.get(engine_name)(model, tokenizer, torch.device("cpu"))
    executor = ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=2.0, max_output_chars=512)
    limits = AgentLimits(max_turns=2, max_new_tokens=24, max_total_tokens=1024, max_tool_calls=8)
    torch.manual_seed(0)
    sampling = SamplingParams(24, 0.8, top_p, top_k)
    trajs = run_agent(engine, tokenizer, executor, tasks[:4], 2, limits, sampling, HERMES)
    batch = collate(trajs, torch.zeros(len(trajs)), tokenizer.pad_token_id)
    with torch.no_grad():
        filtered = token_logprobs(model, batch, SamplingParams(1, 0.8, top_p, top_k))
        unfiltered = token_logprobs(model, batch, SamplingParams(1, 0.8))
    assert batch.mask.sum() > 0
    assert ((filtered - batch.old_logp).abs() * batch.mask).max().item() < 1e-4
    assert ((unfiltered - batch.old_logp).abs() * batch.mask).max().item() > 1e-2


def test_torch_engine_drops_finished_rows_without_changing_the_others(tool_model_dir):
    """Turns of different lengths in one batch: the torch loop, whose batch shrinks as rows end, writes what
    generate writes under greedy decoding, and every log-prob it reports while sampling is its token's
    under a full forward pass of that row alone."""
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    prompts = [
        render(tokenizer, CONVERSATION[:2], [CALC_TOOL], add_generation_prompt=True),  # two tool calls
        render(tokenizer, GREETING[:2], None, add_generation_prompt=True),  # a short greeting
        render(tokenizer, CONVERSATION[:5], [CALC_TOOL], add_generation_prompt=True),  # the final answer
    ]
    fast = ENGINES.get("torch")(model, tokenizer, torch.device("cpu"))
    reference = ENGINES.get("hf")(model, tokenizer, torch.device("cpu"))
    greedy = SamplingParams(64, temperature=0.0)
    ours, theirs = fast.generate(prompts, greedy), reference.generate(prompts, greedy)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    assert all(c.stopped for c in ours) and len({len(c.token_ids) for c in ours}) > 1
    for c, r in zip(ours, theirs):
        assert max(abs(a - b) for a, b in zip(c.logprobs, r.logprobs)) < 1e-4
    tiny = SamplingParams(64, temperature=1e-50)  # below GREEDY_BELOW: greedy, as vLLM reads it, not NaN
    for engine in (fast, reference):
        assert [c.token_ids for c in engine.generate(prompts, tiny)] == [c.token_ids for c in ours]

    torch.manual_seed(0)
    sampled = fast.generate(prompts * 4, SamplingParams(64, temperature=1.5))
    assert len({len(c.token_ids) for c in sampled}) > 1  # rows left the batch at different steps
    for prompt, c in zip(prompts * 4, sampled):
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 1.5  # [T, V]
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert (expected - torch.tensor(c.logprobs)).abs().max().item() < 1e-4


def test_torch_engine_prefills_only_what_a_turn_appended_until_the_weights_change(tool_model_dir):
    """The next call's prompts continue the last call's rows (their tokens, an observation, a new turn): the
    torch engine feeds only the appended tokens, and every log-prob it reports is its token's under a full
    forward pass. After the weights change and are synced, nothing computed by the old ones is reused."""
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    engine = ENGINES.get("torch")(model, tokenizer, torch.device("cpu"))
    sampling = SamplingParams(24, temperature=1.5)
    prompts = [render(tokenizer, CONVERSATION[:2], [CALC_TOOL], add_generation_prompt=True)] * 3
    prompts.append(render(tokenizer, GREETING[:2], None, add_generation_prompt=True))
    torch.manual_seed(0)
    first = engine.generate(prompts, sampling)
    observation = tokenizer.encode("<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n")
    turn = tokenizer.encode("<|im_start|>assistant\n")
    continued = [p + c.token_ids + observation + turn for p, c in zip(prompts, first)]
    widths = []
    model.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape), with_kwargs=True)

    def check(completions):
        for prompt, c in zip(continued, completions):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
            expected = (logits / 1.5).log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            assert (expected - torch.tensor(c.logprobs)).abs().max().item() < 1e-4

    widths.clear()
    check(engine.generate(continued, sampling))
    # the prefill fed each row its last sampled token (sampled, never fed), the observation and the new turn
    assert widths[0][1] == 1 + len(observation + turn) < min(map(len, continued))

    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    engine.sync_weights(model)
    widths.clear()
    check(engine.generate(continued, sampling))
    assert widths[0][1] == max(map(len, continued))  # everything encoded again, by the new weights


def test_draw_samples_each_token_at_its_probability_and_never_a_zero():
    """The inverse-CDF draw the samplers use: frequencies over 200k draws match the probabilities (to
    0.005, about 4 standard errors), tokens of probability 0 (first, inner and last) never come up, and
    rows need not sum to 1."""
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    rows = 200_000
    tokens = draw((probs * 3).expand(rows, -1), torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=len(probs)).float() / rows
    assert freq[probs == 0].sum().item() == 0
    assert (freq - probs).abs().max().item() < 0.005
    one_hot = torch.zeros(4, 1024)
    one_hot[torch.arange(4), torch.tensor([0, 7, 500, 1023])] = 1.0
    assert draw(one_hot).tolist() == [0, 7, 500, 1023]


def test_draw_follows_its_generator():
    probs = torch.rand(8, 50)
    first = draw(probs, torch.Generator().manual_seed(3))
    assert torch.equal(first, draw(probs, torch.Generator().manual_seed(3)))
    assert not torch.equal(first, draw(probs, torch.Generator().manual_seed(4)))


def loop_as_first_written(model, prompts, params, end_id, pad_id, reuse, store):
    """The torch engine's loop before the decoding loop took it over, kept as the reference for its draws:
    one draw for the whole live batch from the global RNG each step, rows dropped once they end."""
    completions = [([], []) for _ in prompts]
    live = list(range(len(prompts)))
    batch = CachedBatch(model, prompts, pad_id, reuse=reuse, store=store)
    for step in range(params.max_new_tokens):
        logprobs = warped(batch.logits, params.temperature, params.top_p, params.top_k).log_softmax(dim=-1)
        tokens = draw(logprobs.exp())
        logprobs = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
        for row, token, logprob in zip(live, tokens.tolist(), logprobs.tolist()):
            completions[row][0].append(token)
            completions[row][1].append(logprob)
        going = tokens != end_id
        if step == params.max_new_tokens - 1 or not going.any():
            break
        keep = None if going.all() else going.nonzero().squeeze(-1)
        live = live if keep is None else [live[i] for i in keep.tolist()]
        batch.step(tokens if keep is None else tokens[keep], keep)
    batch.store_live_rows()
    return completions


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(1.5, 1.0, 0), (0.9, 0.9, 30)])
def test_torch_engine_draws_what_its_first_loop_drew(tool_model_dir, temperature, top_p, top_k):
    """Bit for bit, over two calls whose second continues the first (its prefill reuses the stored rows): the
    rollout's tokens and log-probs do not depend on which decoding loop runs them."""
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    engine = ENGINES.get("torch")(model, tokenizer, torch.device("cpu"))
    sampling = SamplingParams(40, temperature, top_p, top_k)
    prompts = [render(tokenizer, CONVERSATION[:2], [CALC_TOOL], add_generation_prompt=True)] * 3
    prompts += [render(tokenizer, GREETING[:2], None, add_generation_prompt=True)] * 3
    first, stored = PrefixStore(), PrefixStore()
    torch.manual_seed(0)
    with torch.no_grad():
        reference = loop_as_first_written(model, prompts, sampling, tokenizer.eos_token_id, engine.pad_id, None, first)
    torch.manual_seed(0)
    ours = engine.generate(prompts, sampling)
    assert [(c.token_ids, c.logprobs) for c in ours] == [tuple(r) for r in reference]
    assert len({len(c.token_ids) for c in ours}) > 1  # rows left the batch at different steps

    observation = tokenizer.encode("<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n")
    continued = [p + c.token_ids + observation for p, c in zip(prompts, ours)]
    torch.manual_seed(1)
    with torch.no_grad():
        reference = loop_as_first_written(
            model, continued, sampling, tokenizer.eos_token_id, engine.pad_id, first, stored
        )
    torch.manual_seed(1)
    assert [(c.token_ids, c.logprobs) for c in engine.generate(continued, sampling)] == [tuple(r) for r in reference]


def test_engines_end_a_turn_on_every_end_of_turn_token_of_the_generation_config(tool_model_dir):
    """A checkpoint whose generation config lists a second end-of-turn token (here the greeting's fourth
    token): the torch and HF engines both end the turn on it, as on the tokenizer's EOS."""
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    prompt = render(tokenizer, GREETING[:2], None, add_generation_prompt=True)
    greedy = SamplingParams(64, temperature=0.0)
    full = ENGINES.get("torch")(model, tokenizer, torch.device("cpu")).generate([prompt], greedy)[0].token_ids
    assert full[-1] == tokenizer.eos_token_id and full[3] not in full[:3]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, full[3]]
    for name in ("torch", "hf"):
        completion = ENGINES.get(name)(model, tokenizer, torch.device("cpu")).generate([prompt], greedy)[0]
        assert completion.token_ids == full[:4] and completion.stopped, name


@pytest.mark.parametrize("engine_name", ["hf", "torch"])
def test_module_engines_refuse_stop_strings(tiny_policy, engine_name):
    model, tokenizer, _ = tiny_policy
    engine = ENGINES.get(engine_name)(model, tokenizer, torch.device("cpu"))
    with pytest.raises(ValueError, match="end-of-turn tokens only"):
        engine.generate([[1, 2, 3]], SamplingParams(4, stop=("</answer>",)))
