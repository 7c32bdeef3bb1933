"""The multi-turn agent loop: generate, parse, run tools, append observations, repeat.

Each trajectory goes on until it answers, produces an invalid turn, or runs out of turns or tokens, in one of
two schedules. With a round barrier (`barrier=True`, rollout.barrier, and every engine without a `session`),
all live trajectories advance together, one assistant turn per engine call, and the calls of all of them after
a turn run together, tools.max_concurrent_calls at once. Without one (an engine's `session`: the torch
engine's decoding loop, vLLM's own scheduler), a trajectory whose turn ends starts its calls at once, on the
executor's pool, while the other rows keep decoding, and its next turn joins the running batch at the next
decoding step once its observations are in (continuous batching across turns); each trajectory then draws from
a torch.Generator of its own, seeded from the global RNG, so that what it samples does not depend on when tool
wall-clock let it join, up to the rounding of batched matrix products. The next prompt is built token-in /
token-out (`minirl.protocol.chat`), so every sampled token stays exactly as sampled and keeps its sampler
log-prob. Every call gets an id (`call_<turn>_<i>`) that its tool message carries as `tool_call_id`, next to the
tool's `name`; each tool result enters the context cut to `protocol.max_tool_output_tokens` tokens
(`protocol.observation_cut` says which ones stay), and further when the next prompt would leave fewer than
`protocol.min_sample_room` tokens of the budget to sample. A `cancel` event set from another thread stops
the rollout at its next turn (with the barrier) or decoding step (without one): `RolloutCancelled`."""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from minirl.config import ProtocolConfig, RolloutConfig
from minirl.data.task import Task
from minirl.inference.loop import DecodeLoop, RowRequest, StopReason
from minirl.protocol.chat import (
    assistant_turn,
    next_prompt,
    render,
    require_tool_rounds,
    thinking_views,
    turn_deltas,
)
from minirl.protocol.observation import fit_tool_messages
from minirl.protocol.parsing import TurnKind, parse_turn
from minirl.rollout.engine import Completion, Engine, SamplingParams
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools.executor import CallRequest, PendingCalls, ToolExecutor


class RolloutCancelled(Exception):
    """The rollout's `cancel` event was set: it stopped, and what it sampled is dropped."""


def _stop_if_cancelled(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise RolloutCancelled("the rollout was cancelled")


@dataclass
class AgentLimits:
    max_turns: int
    max_new_tokens: int  # per assistant turn
    max_total_tokens: int  # prompt + everything appended to it
    max_tool_calls: int  # per trajectory; later calls get an "over_budget" observation instead of running

    @classmethod
    def from_config(cls, cfg: RolloutConfig) -> AgentLimits:
        return cls(cfg.max_turns, cfg.max_new_tokens, cfg.max_total_tokens, cfg.max_tool_calls)


@dataclass
class _Live:
    """What a trajectory needs between turns: its token prompt, its semantic history and the tokenizer it renders
    with (thinking on or off: a view of the run's, chat.thinking_views)."""

    traj: Trajectory
    prompt: list[int]
    history: list[dict]
    tokenizer: Any
    sampled: list[int] = field(default_factory=list)  # the last turn's sampled tokens
    generator: torch.Generator | None = None  # without a round barrier: the one it draws from


def _tool_names(task: Task) -> list[str]:
    return [t["function"]["name"] for t in task.tools]


def _assistant_message(turn: Turn) -> dict:
    return {
        "role": "assistant",
        "content": turn.parsed.content,
        "tool_calls": [c.to_message_dict() for c in turn.parsed.tool_calls],
    }


def run_agent(
    engine: Engine,
    tokenizer,
    executor: ToolExecutor,
    tasks: list[Task],
    group_size: int,
    limits: AgentLimits,
    sampling: SamplingParams,
    protocol: ProtocolConfig,
    thinking: Sequence[bool] | None = None,
    barrier: bool = True,
    cancel: threading.Event | None = None,
) -> list[Trajectory]:
    """`group_size` trajectories per task; trajectories of one task are contiguous. `protocol` says
    how calls are read (format, call policy) and how many tokens of each tool result the model sees. `thinking`,
    one per trajectory (rollout/thinking.py), says whether it renders with the template's thinking on; it is
    recorded on the trajectory. `barrier`: the schedule (module docstring); an engine without a `session`
    always runs with one. A task whose first prompt alone fills limits.max_total_tokens samples nothing: its
    trajectories end at once (TOKEN_BUDGET, no response tokens). A chat template that cannot build
    limits.max_turns - 1 tool rounds in a row raises ConfigError before anything is sampled (require_tool_rounds)."""
    views = {None: tokenizer} if thinking is None else thinking_views(tokenizer)
    for view in views.values():
        require_tool_rounds(view, limits.max_turns - 1)
    flags = [None] * (len(tasks) * group_size) if thinking is None else list(thinking)
    live: list[_Live] = []
    for index, task in enumerate(tasks):
        prompts = {
            on: render(view, task.messages, task.tools, add_generation_prompt=True) for on, view in views.items()
        }
        for on in flags[index * group_size : (index + 1) * group_size]:
            prompt = prompts[on]
            traj = Trajectory(task, index, list(prompt), thinking=on)
            live.append(_Live(traj, list(prompt), list(task.messages), views[on]))
            if len(prompt) >= limits.max_total_tokens:
                traj.finish_reason = TrajectoryEnd.TOKEN_BUDGET
    trajectories = [s.traj for s in live]
    session = getattr(engine, "session", None)
    if barrier or session is None:
        _with_barrier(engine, executor, live, limits, sampling, protocol, cancel)
    else:
        if not sampling.greedy:
            _own_generators(live, sampling.seed, engine.device)
        with session() as loop:
            _without_barrier(loop, engine.end_ids, executor, live, limits, sampling, protocol, cancel)
    return trajectories


def _with_barrier(
    engine: Engine,
    executor: ToolExecutor,
    live: list[_Live],
    limits: AgentLimits,
    sampling: SamplingParams,
    protocol: ProtocolConfig,
    cancel: threading.Event | None,
) -> None:
    """Turn by turn: one engine call for every live trajectory, then all their calls together."""
    for turn_index in range(limits.max_turns):
        _stop_if_cancelled(cancel)
        live = [s for s in live if not s.traj.done]
        if not live:
            break
        completions = engine.generate([s.prompt for s in live], sampling)
        turns = [
            _record(state, completion, turn_index, state.tokenizer, engine.end_ids, limits, protocol)
            for state, completion in zip(live, completions)
        ]
        calling = [(s, turn) for s, turn in zip(live, turns) if turn is not None and calls_follow(s.traj, turn)]
        # every trajectory's calls of this turn together: one's slow call does not hold up another's
        results = executor.execute_batch([tool_request(s.traj, turn, limits) for s, turn in calling])
        for (state, turn), tool_results in zip(calling, results):
            turn.tool_results = tool_results
            if another_turn(state.traj, turn_index, limits):
                _append_observations(state, turn, limits, protocol)


def _own_generators(live: list[_Live], seed: int | None, device) -> None:
    """A generator for every trajectory, its seed drawn from the global torch RNG (seeded with `seed` first
    when given, as a module engine's generate call does)."""
    if seed is not None:
        torch.manual_seed(seed)
    for state, row_seed in zip(live, torch.randint(0, 2**62, (len(live),)).tolist()):
        state.generator = torch.Generator(device=device).manual_seed(row_seed)


def _without_barrier(
    loop: DecodeLoop,
    end_ids: Collection[int],
    executor: ToolExecutor,
    live: list[_Live],
    limits: AgentLimits,
    sampling: SamplingParams,
    protocol: ProtocolConfig,
    cancel: threading.Event | None,
) -> None:
    """Every trajectory on one decoding loop: a finished turn's calls start on the pool at once, and the next
    turn is admitted as soon as they are in (module docstring)."""
    rows: dict[int, tuple[_Live, int, Completion]] = {}  # the loop's row -> (trajectory, its turn, what it sampled)
    calling: list[tuple[_Live, Turn, int, PendingCalls]] = []  # turns whose calls run

    def admit(state: _Live, turn_index: int) -> None:
        row = loop.admit([RowRequest(state.prompt, sampling, state.generator)])[0]
        rows[row] = (state, turn_index, Completion([], [], False))

    for state in live:
        if not state.traj.done:
            admit(state, 0)
    with executor.pool() as pool:
        while loop.rows or calling:
            _stop_if_cancelled(cancel)
            if loop.rows:
                for sampled in loop.step():
                    state, turn_index, completion = rows[sampled.row]
                    completion.token_ids.append(sampled.token)
                    completion.logprobs.append(sampled.logprob)
                    if sampled.stop is None:
                        continue
                    del rows[sampled.row]
                    completion.stopped = sampled.stop is StopReason.stop
                    turn = _record(state, completion, turn_index, state.tokenizer, end_ids, limits, protocol)
                    if turn is not None and calls_follow(state.traj, turn):
                        request = pool.submit(tool_request(state.traj, turn, limits))
                        calling.append((state, turn, turn_index, request))
            else:  # nothing decodes: wait for a running call (a done one would return at once: a busy loop)
                running = [future for *_, pending in calling for future in pending.futures() if not future.done()]
                wait(running, return_when=FIRST_COMPLETED)
            for item in [item for item in calling if item[3].done()]:
                calling.remove(item)
                state, turn, turn_index, pending = item
                turn.tool_results = pending.results()
                if another_turn(state.traj, turn_index, limits):
                    _append_observations(state, turn, limits, protocol)
                    if not state.traj.done:
                        admit(state, turn_index + 1)


def run_turn_tools(traj: Trajectory, turn: Turn, turn_index: int, executor: ToolExecutor, limits: AgentLimits) -> bool:
    """After a turn that ended on its own (not cut by a token limit): an answer or an invalid turn ends the
    trajectory; otherwise run its calls within the conversation's tool-call budget (results go on the turn)
    and end at max_turns. Returns whether the trajectory goes on to another turn. Both agent loops (this
    one and the message-level one in minirl/evaluation) share its parts; run_agent runs the calls of all
    trajectories of a turn together (ToolExecutor.execute_batch)."""
    if not calls_follow(traj, turn):
        return False
    turn.tool_results = executor.execute_many(*tool_request(traj, turn, limits))
    return another_turn(traj, turn_index, limits)


def calls_follow(traj: Trajectory, turn: Turn) -> bool:
    """Whether the turn's calls run next: an answer or an invalid turn ends the trajectory instead."""
    if turn.parsed.kind is TurnKind.ANSWER:
        traj.finish_reason = TrajectoryEnd.ANSWER
        return False
    if turn.parsed.kind is TurnKind.INVALID:
        traj.finish_reason = TrajectoryEnd.INVALID
        return False
    return True


def tool_request(traj: Trajectory, turn: Turn, limits: AgentLimits) -> CallRequest:
    """The turn's calls, the task's tools, and what is left of the conversation's tool-call budget."""
    used = sum(len(t.tool_results) for t in traj.turns[:-1])
    return turn.parsed.tool_calls, _tool_names(traj.task), limits.max_tool_calls - used


def another_turn(traj: Trajectory, turn_index: int, limits: AgentLimits) -> bool:
    """After the turn's calls ran: whether a turn follows (else the trajectory ends at max_turns)."""
    if turn_index + 1 >= limits.max_turns:
        traj.finish_reason = TrajectoryEnd.MAX_TURNS
        return False
    return True


def _advance(
    state: _Live,
    completion,
    turn_index: int,
    tokenizer,
    end_ids: Collection[int],
    executor: ToolExecutor,
    limits: AgentLimits,
    protocol: ProtocolConfig,
) -> None:
    """One trajectory's turn from its completion: record it, run its calls, append their observations."""
    turn = _record(state, completion, turn_index, tokenizer, end_ids, limits, protocol)
    if turn is not None and run_turn_tools(state.traj, turn, turn_index, executor, limits):
        _append_observations(state, turn, limits, protocol)


def _record(
    state: _Live,
    completion,
    turn_index: int,
    tokenizer,
    end_ids: Collection[int],
    limits: AgentLimits,
    protocol: ProtocolConfig,
) -> Turn | None:
    """The completion's tokens appended (within the token budget) and parsed into a turn: the turn, or None when
    a token limit ended the trajectory."""
    traj = state.traj
    room = limits.max_total_tokens - len(state.prompt)
    tokens, logprobs = completion.token_ids[:room], completion.logprobs[:room]
    state.sampled = tokens
    traj.response_ids += tokens
    traj.action_mask += [1] * len(tokens)
    traj.sampler_logprobs += logprobs
    # some samplers return the end-of-turn token, some stop without it; it is not part of the text
    body = tokens[:-1] if tokens and tokens[-1] in end_ids else tokens
    text = tokenizer.decode(body, skip_special_tokens=False)
    parsed = parse_turn(
        text,
        protocol.format,
        protocol.call_policy,
        protocol.max_calls_per_turn,
        call_id_prefix=f"call_{turn_index}",  # ids are unique within a trajectory: call_<turn>_<i>
        tools=traj.task.tools,
    )
    turn = Turn(text, parsed)
    traj.turns.append(turn)
    if len(tokens) < len(completion.token_ids):
        traj.finish_reason = TrajectoryEnd.TOKEN_BUDGET
        return None
    if not completion.stopped:
        traj.finish_reason = TrajectoryEnd.TURN_TOKENS
        return None
    return turn


def _append_observations(state: _Live, turn: Turn, limits: AgentLimits, protocol: ProtocolConfig) -> None:
    """The turn's tool results as the next prompt's observation tokens (mask 0), cut to fit; a next prompt that
    would not leave room to sample ends the trajectory (TOKEN_BUDGET)."""
    traj, tokenizer, tokens = state.traj, state.tokenizer, state.sampled
    assistant = _assistant_message(turn)
    # the next prompt, leaving room to sample (no more than a turn samples)
    longest = limits.max_total_tokens - min(protocol.min_sample_room, limits.max_new_tokens)

    def within_budget(observations: list[dict]) -> tuple[list[dict], list[int], list[int]] | None:
        deltas = turn_deltas(tokenizer, state.history, traj.task.tools, observations, assistant["tool_calls"])
        prompt, added = next_prompt(state.prompt, tokens, deltas)
        return (observations, prompt, added) if len(prompt) <= longest else None

    fit = fit_tool_messages(
        turn.tool_results, tokenizer, protocol.max_tool_output_tokens, protocol.observation_cut, within_budget
    )
    if fit is None:  # not even the markers alone leave room
        traj.finish_reason = TrajectoryEnd.TOKEN_BUDGET
        return
    observations, prompt, added = fit
    traj.response_ids += added
    traj.action_mask += [0] * len(added)
    traj.sampler_logprobs += [0.0] * len(added)
    state.history += [assistant, *observations]
    state.prompt = prompt


def replay_reference(
    task: Task,
    group_index: int,
    tokenizer,
    executor: ToolExecutor,
    limits: AgentLimits,
    protocol: ProtocolConfig,
    thinking: bool | None = None,
) -> Trajectory:
    """The task's reference answer played through the agent loop as if the policy had sampled it: each
    reference assistant message becomes the tokens the chat template renders for it (end-of-turn token
    included), parsed, its calls run by the executor, and the observations appended token-in / token-out,
    as in run_agent, with the template's thinking on or off as `thinking` says (None: as configured). Its
    sampler log-probs are 0: no sampler drew it (`off_policy` is set)."""
    tokenizer = tokenizer if thinking is None else thinking_views(tokenizer)[thinking]
    prompt = render(tokenizer, task.messages, task.tools, add_generation_prompt=True)
    traj = Trajectory(task, group_index, list(prompt), off_policy=True, thinking=thinking)
    state = _Live(traj, list(prompt), list(task.messages), tokenizer)
    replies = [m for m in task.reference if m["role"] == "assistant"]
    for turn_index, message in enumerate(replies[: limits.max_turns]):
        _, tokens = assistant_turn(tokenizer, [*state.history, message], task.tools)
        tokens = tokens[: limits.max_new_tokens]
        stopped = bool(tokens) and tokens[-1] == tokenizer.eos_token_id  # the template's end-of-turn token
        completion = Completion(tokens, [0.0] * len(tokens), stopped)
        _advance(state, completion, turn_index, tokenizer, {tokenizer.eos_token_id}, executor, limits, protocol)
        if state.traj.done:
            break
    return state.traj
