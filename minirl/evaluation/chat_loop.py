"""The message-level agent loop for OpenAI-compatible endpoints: the `openai` eval backend.

It mirrors the training loop (minirl/rollout/agent_loop.py) one message at a time: send the conversation and
the task's tools, read `message.content`, `message.tool_calls` and `finish_reason`, run the calls with the same
ToolExecutor, append the assistant message and one tool message per call (`tool_call_id`, `name`), repeat. The
same turn, tool-call and token budgets end a conversation for the same reasons, and the turns are the same
`Turn` objects (parse_message applies parse_turn's rules), so one reward and success code scores both backends;
reasoning the endpoint returns apart (`reasoning_content`) goes back into the turn's text as a <think> block, and
a <think> block an endpoint leaves in the content is reasoning there too, never read for calls (split_reasoning).

Where it differs: the endpoint renders the conversation itself, so there are no token ids or log-probs; the
total-token budget is read from the response's `usage` (when the endpoint reports it), and a turn past it is
kept whole, not cut; tool results are cut only in characters (tools.max_output_chars), not to
protocol.max_tool_output_tokens, which needs the tokenizer, and go as they are: the text of a control token
in a result (`<|im_end|>`) is not defused, so the endpoint's tokenizer may read it as that token. A turn's
text is what the endpoint returns, not the sampled text verbatim (no call markup; a <think> cut by max_tokens
comes back closed), so reward terms that read raw text (repetition, think length) can differ on a conversation
that did not end with an answer.
A request that still fails after the client's retries ends its conversation as TrajectoryEnd.ERROR with the error.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai

from minirl.config import ProtocolConfig
from minirl.data.task import Task
from minirl.errors import ConfigError
from minirl.protocol.formats import THINK_CLOSE, THINK_OPEN
from minirl.protocol.parsing import parse_message
from minirl.rollout.agent_loop import AgentLimits, run_turn_tools
from minirl.rollout.engine import SamplingParams
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools.executor import ToolExecutor

MAX_RETRIES = 3  # per request, with the client's backoff: connection errors, timeouts, 408, 409, 429, 5xx


def connect(base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=MAX_RETRIES)


def first_model(client: openai.OpenAI) -> str:
    """The first model the endpoint lists; ConfigError when it cannot be reached or lists none."""
    try:
        models = client.models.list().data
    except openai.AuthenticationError:
        raise ConfigError(f"eval.api_key: {client.base_url} refuses it (401); pass the server's key") from None
    except openai.APIError as err:
        raise ConfigError(f"eval.base_url: cannot list the models of {client.base_url} ({err})") from None
    if not models:
        raise ConfigError(f"eval.model_id: {client.base_url} lists no models; name one (eval.model_id=...)")
    return models[0].id


def run_chat_agent(
    client: openai.OpenAI,
    model: str,
    executor: ToolExecutor,
    tasks: list[Task],
    samples: int,
    limits: AgentLimits,
    sampling: SamplingParams,
    protocol: ProtocolConfig,
    concurrency: int,
) -> list[Trajectory]:
    """`samples` trajectories per task, contiguous, `concurrency` conversations in flight; sample k of a task
    asks for seed `sampling.seed + k`."""
    conversations = [(index, task, k) for index, task in enumerate(tasks) for k in range(samples)]

    def converse(conversation: tuple[int, Task, int]) -> Trajectory:
        index, task, k = conversation
        traj = Trajectory(task, index, prompt_ids=[])
        seed = None if sampling.seed is None else sampling.seed + k
        try:
            _converse(client, model, executor, traj, limits, sampling, seed, protocol)
        except openai.APIError as err:
            traj.finish_reason, traj.error = TrajectoryEnd.ERROR, f"{type(err).__name__}: {err}"
        return traj

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(converse, conversations))


def _request(model: str, messages: list[dict], task: Task, sampling: SamplingParams, seed: int | None) -> dict:
    """The chat-completion arguments; top-k, which the OpenAI API lacks, goes in the body as vLLM reads it."""
    request = {
        "model": model,
        "messages": messages,
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    if task.tools:
        request["tools"] = task.tools
    if seed is not None:
        request["seed"] = seed
    if sampling.top_k > 0:
        request["extra_body"] = {"top_k": sampling.top_k}
    return request


def _reasoning(message) -> str:
    """The reasoning an endpoint split off the content (vLLM's field, under its older and newer name)."""
    return getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None) or ""


def _converse(
    client: openai.OpenAI,
    model: str,
    executor: ToolExecutor,
    traj: Trajectory,
    limits: AgentLimits,
    sampling: SamplingParams,
    seed: int | None,
    protocol: ProtocolConfig,
) -> None:
    """Run one conversation to its end, filling `traj`; a request that failed raises openai.APIError."""
    task = traj.task
    messages = list(task.messages)
    for turn_index in range(limits.max_turns):
        response = client.chat.completions.create(**_request(model, messages, task, sampling, seed))
        if not response.choices:
            traj.finish_reason, traj.error = TrajectoryEnd.ERROR, "the endpoint returned no choices"
            return
        choice, usage = response.choices[0], response.usage
        if usage is not None and usage.prompt_tokens >= limits.max_total_tokens:
            traj.finish_reason = TrajectoryEnd.TOKEN_BUDGET  # the training loop stops before sampling this turn
            return
        content = choice.message.content or ""
        reasoning = _reasoning(choice.message)
        calls = [
            (call.id or f"call_{turn_index}_{i}", call.function.name, call.function.arguments)
            for i, call in enumerate(choice.message.tool_calls or [])
        ]
        parsed = parse_message(
            content, calls, protocol.format, protocol.call_policy, protocol.max_calls_per_turn, task.tools
        )
        turn = Turn(f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{content}" if reasoning else content, parsed)
        traj.turns.append(turn)
        if usage is not None and usage.prompt_tokens + usage.completion_tokens > limits.max_total_tokens:
            traj.finish_reason = TrajectoryEnd.TOKEN_BUDGET
            return
        if choice.finish_reason == "length":
            traj.finish_reason = TrajectoryEnd.TURN_TOKENS
            return
        if not run_turn_tools(traj, turn, turn_index, executor, limits):
            return
        tool_calls = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ]
        messages += [
            {"role": "assistant", "content": choice.message.content, "tool_calls": tool_calls},
            *(result.to_message() for result in turn.tool_results),
        ]
