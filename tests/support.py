"""What tests share besides fixtures (those are in conftest.py): the conversations and the tool schema the
fixture models memorise, the config builders, the server launcher, and hand-written fakes small enough to
read: a causal LM with a KV cache, a scripted rollout engine and a scripted server decoder; the calculator tool
with calls held back (Staggered).

Import from here (`from support import CONVERSATION, debug_config`); pyproject.toml puts tests/ on the path.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from minirl.rollout.engine import Completion
from minirl.serving.decoder import RowResult, StopReason
from minirl.serving.launch import ServerProcess, launch_server
from minirl.tools import TOOLS

CalculateMath = TOOLS.get("calculate_math")

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO.parent / "shared" / "fixtures" / "chat_templates"

# -- conversations ---------------------------------------------------------------------------------

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate_math",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 256 * 37"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant with tools."},
    {"role": "user", "content": "What is 256 * 37 and 12 + 30?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calculate_math", "arguments": {"expression": "256 * 37"}},
            },
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculate_math", "arguments": {"expression": "12 + 30"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "name": "calculate_math", "content": '{"result": "9472"}'},
    {"role": "tool", "tool_call_id": "call_1", "name": "calculate_math", "content": '{"result": "42"}'},
    {"role": "assistant", "content": "256 * 37 = 9472 and 12 + 30 = 42."},
]

GREETING = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say hello."},
    {"role": "assistant", "content": "<think>A greeting.</think>Hello! How can I help?"},
]


def memorising_model(conversation: list[dict], path: Path, num_heads: int):
    """(model, tokenizer): a 2-layer hidden-64 Qwen2 (`num_heads` heads, half as many kv heads) that has memorised
    `conversation` (offered CALC_TOOL) and GREETING, in eval mode, saved with save_pretrained at `path`."""
    from minirl.config import SFTConfig, TinyModelConfig
    from minirl.models.tiny import build_model, build_tokenizer, render_texts
    from minirl.training.sft import tokenize_conversation, train_sft

    cfg = TinyModelConfig(
        vocab_size=400, hidden_size=64, num_layers=2, num_heads=num_heads, num_kv_heads=num_heads // 2
    )
    tokenizer = build_tokenizer(cfg, render_texts([(conversation, [CALC_TOOL]), (GREETING, [])] * 20))
    model = build_model(cfg, tokenizer)
    examples = [
        tokenize_conversation(tokenizer, conversation, [CALC_TOOL]),
        tokenize_conversation(tokenizer, GREETING, None),
    ]
    sft = SFTConfig(epochs=100, batch_size=8, lr=5e-3, warmup_steps=10)  # 100 steps, ~15 s on one core
    train_sft(model, tokenizer, examples * 4, sft, torch.device("cpu"))
    model.eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


# what each fixture template calls its end-of-turn and begin-of-text tokens (its `eos_token` / `bos_token`)
TEMPLATE_TOKENS = {
    "llama3": ("<|eot_id|>", "<|begin_of_text|>"),
    "deepseek": ("<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"),
    "gptoss": ("<|return|>", "<|startoftext|>"),
}
SPECIAL_IN_TEMPLATE = re.compile(r"<\|[a-z_]+\|>|<｜[^｜<>]+｜>")


def template_tokenizer(name: str):
    """The tiny tokenizer type (trained on the support conversations) under the fixture template `name`, with
    the template's special tokens (`<|...|>`, `<｜...｜>`) as single tokens and its own end-of-turn and
    beginning tokens as eos and bos (Qwen's <|im_end|> is the tiny tokenizer's eos already)."""
    from minirl.config import TinyModelConfig
    from minirl.models.tiny import build_tokenizer, render_texts

    template = third_party_template(name)
    tokenizer = build_tokenizer(TinyModelConfig(vocab_size=400), render_texts([(CONVERSATION, [CALC_TOOL])] * 20))
    specials = sorted(set(SPECIAL_IN_TEMPLATE.findall(template)) - set(tokenizer.all_special_tokens))
    tokenizer.add_special_tokens({"additional_special_tokens": specials}, replace_extra_special_tokens=False)
    for family, (eos, bos) in TEMPLATE_TOKENS.items():
        if name.startswith(family):  # single tokens too (a template may write them only as eos_token/bos_token)
            tokenizer.add_special_tokens({"eos_token": eos, "bos_token": bos})
    tokenizer.chat_template = template
    return tokenizer


def third_party_template(name: str) -> str:
    """The text of a third-party chat template fixture (qwen2_5.jinja, qwen3_coder.jinja); skips without them."""
    path = TEMPLATES / name
    if not path.exists():
        pytest.skip(f"third-party chat template fixtures not found at {TEMPLATES} (a user's clone has none)")
    return path.read_text()


# -- configs ---------------------------------------------------------------------------------------

# the untrained debug model solves nothing, so under the default outcome reward every group ties and its
# advantages are 0; tests that need the weights to move use MiniMind's shaped reward
SHAPED_REWARD = "reward=minimind"


def compose_config(cache_dir: Path, run_dir: Path, *overrides: str):
    """The composed, validated config of `overrides`, building the tiny model in `cache_dir`, run in `run_dir`."""
    from hydra import compose, initialize_config_dir

    from minirl.config import register_configs, to_config
    from minirl.entry import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(compose("config", overrides=[f"model.cache_dir={cache_dir}", *overrides]))
    cfg.output_dir = str(run_dir)
    return cfg


def debug_config(cache_dir: Path, run_dir: Path, *overrides: str):
    """The composed config of the debug preset (a very small tiny model, two steps) with `overrides`."""
    return compose_config(cache_dir, run_dir, "debug=cpu", *overrides)


# -- server processes ------------------------------------------------------------------------------


def start_server(run_dir: Path, *overrides: str, api_key: str | None = None) -> ServerProcess:
    """`python -m minirl.serve` on a free loopback port, ready; with `base_url`, `model_id` and `stop()`.
    `api_key` goes in as $MINIRL_API_KEY; without it the server gets no key, whatever this environment holds."""
    env = {name: value for name, value in os.environ.items() if name != "MINIRL_API_KEY"}
    if api_key is not None:
        env["MINIRL_API_KEY"] = api_key
    return launch_server(["serve.host=127.0.0.1", "serve.port=0", "logger=none", *overrides], run_dir, env=env)


# -- fakes -----------------------------------------------------------------------------------------


class TinyCausalLM(torch.nn.Module):
    """A causal LM of a few hundred weights with the interface the trainer's forward passes call
    (`minirl.inference.decoding.prompt_shared_logits` and its `prefill`): token and position embeddings, one
    single-head causal attention layer that reads and extends a transformers `DynamicCache`, a linear head.

    `model(input_ids, attention_mask=, position_ids=, past_key_values=, use_cache=, logits_to_keep=)` returns
    an object whose `.logits` is [B, T, V] (the last `logits_to_keep` positions when that is > 0). Position t
    of a row attends the columns up to its own (the cached ones first) that `attention_mask` keeps, so a row's
    logits depend on every earlier token and on nothing after it or in padding, as in a real transformer."""

    def __init__(self, vocab_size: int = 11, hidden_size: int = 8, max_positions: int = 64, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.embed = torch.nn.Embedding(vocab_size, hidden_size)
            self.position = torch.nn.Embedding(max_positions, hidden_size)
            self.qkv = torch.nn.Linear(hidden_size, 3 * hidden_size)
            self.head = torch.nn.Linear(hidden_size, vocab_size)
        self.config = SimpleNamespace(vocab_size=vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, C] over the cached columns, then these T
        position_ids: torch.Tensor | None = None,  # [B, T]; default: the columns after the cache
        past_key_values=None,  # a DynamicCache, extended in place
        use_cache: bool = False,
        logits_to_keep: int = 0,
    ) -> SimpleNamespace:
        batch, width = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None:
            attention_mask = torch.ones(batch, past + width, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(past, past + width, device=input_ids.device).expand(batch, -1)
        hidden = self.embed(input_ids) + self.position(position_ids)  # [B, T, H]
        query, key, value = self.qkv(hidden).chunk(3, dim=-1)  # [B, T, H] each
        if past_key_values is not None:
            key, value = past_key_values.update(key[:, None], value[:, None], 0)  # [B, 1, C, H]
            key, value = key[:, 0], value[:, 0]  # [B, C, H]
        columns = torch.arange(key.shape[1], device=input_ids.device)  # [C]
        causal = columns[None, :] <= past + torch.arange(width, device=input_ids.device)[:, None]  # [T, C]
        allowed = causal[None] & attention_mask[:, None, :].bool()  # [B, T, C]
        scores = query @ key.transpose(1, 2) / math.sqrt(hidden.shape[-1])  # [B, T, C]
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)  # exp() is exactly 0 there
        out = hidden + scores.softmax(dim=-1) @ value  # [B, T, H]
        if logits_to_keep:
            out = out[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.head(out))


class ScriptedEngine:
    """A rollout engine that answers turn k of every prompt with script[k]; log-probs are distinct per token so
    that misalignment shows. `stop=False` runs into the token limit instead of ending the turn;
    `return_eos=False` ends the turn without returning the end-of-turn token, as some samplers do."""

    def __init__(
        self, tokenizer, script: list[str], stop: bool = True, return_eos: bool = True, end_tokens: tuple = ()
    ) -> None:
        self.tokenizer, self.script, self.stop, self.return_eos = tokenizer, script, stop, return_eos
        # more end-of-turn tokens (harmony's <|call|>): a scripted turn that ends with one gets no eos after it
        self.end_ids = frozenset({tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list(end_tokens))})
        self.calls = 0
        self.prompts: list[list[list[int]]] = []

    def generate(self, prompts, params):
        self.prompts.append([list(p) for p in prompts])
        text = self.script[self.calls]
        self.calls += 1
        ids = self.turn_ids(text)
        stopped = self.stop and len(ids) <= params.max_new_tokens  # a cut turn did not end
        ids = ids[: params.max_new_tokens]
        out = []
        for row in range(len(prompts)):
            logprobs = [-(row + 1) * 0.001 - i * 0.01 for i in range(len(ids))]
            out.append(Completion(list(ids), logprobs, stopped))
        return out

    def turn_ids(self, text: str) -> list[int]:
        """The tokens the engine answers `text` with: its tokens, then eos when the turn stops and returns its end
        token, unless the text ends with an end-of-turn token of its own."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ends_itself = bool(ids) and ids[-1] in self.end_ids
        return ids + [self.tokenizer.eos_token_id] if self.stop and self.return_eos and not ends_itself else ids

    def sync_weights(self, model) -> None:
        pass


class Staggered(CalculateMath):
    """calculate_math, whose calls sleep: the i-th call `delay(i)` seconds, so that the calls of different
    trajectories end at different times. It records when each call ran."""

    def __init__(self, delay) -> None:
        self.delay, self.count, self.lock, self.windows = delay, itertools.count(), threading.Lock(), []

    def run(self, arguments: dict) -> dict:
        with self.lock:
            index = next(self.count)
        started = time.perf_counter()
        time.sleep(self.delay(index))
        result = super().run(arguments)
        with self.lock:
            self.windows.append((started, time.perf_counter()))
        return result


def trajectory_view(trajs) -> list[tuple]:
    """What two rollouts must share token for token: tokens, masks, how each ended, what its tools answered."""
    return [(t.response_ids, t.action_mask, t.finish_reason, [r.content for u in t.turns for r in u.tool_results])
            for t in trajs]  # fmt: skip


WAIT_S = 120.0  # a bound on waiting for a server's or a fake's state, never an expectation of speed


class ScriptedDecoder:
    """Stands in for the server's Decoder: each batch records its size, waits for a permit (so a test can hold
    the worker), then answers every row with "ok", or raises once `fail_next` is set."""

    def __init__(self) -> None:
        self.permits = threading.Semaphore(0)
        self.batches: list[int] = []
        self.fail_next = False

    def decode(self, rows) -> None:  # rows: list[minirl.serving.decoder.DecodeRow]
        self.batches.append(len(rows))
        assert self.permits.acquire(timeout=WAIT_S)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("scripted failure")
        for row in rows:
            row.sink.text("ok")
            row.sink.done(RowResult("ok", StopReason.stop, 1))
