"""The single-turn work both systems run, defined once: model, prompts, reward and GRPO settings.

A 6.4M-parameter Qwen2 (hidden 256, 6 layers, random weights) with minirl's tokenizer (1,024 BPE tokens and the 6
tool and reasoning tags: a vocabulary of 1,030) and its Qwen2.5-style chat template, saved with `save_pretrained`
and loaded by path by every system; 8 prompts x 4 samples a step, at most 64 new tokens, temperature 1, beta 0.04,
lr 1e-4, 8 steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from minirl.config import Config, TinyModelConfig
from minirl.data import WARM_START_CORPORA
from minirl.models.tiny import build_tokenizer, render_texts

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 256, 6, 4, 2, 1024, 1024
PROMPTS, GROUP, MAX_NEW_TOKENS, BETA, LR, STEPS = 8, 4, 64, 0.04, 1e-4, 8
PAIRS = [(17, 25), (38, 44), (61, 9), (123, 456), (7, 8), (250, 250), (99, 1), (314, 27)]
QUESTIONS = [f"What is {a} plus {b}? Answer with the number." for a, b in PAIRS]
ANSWERS = [str(a + b) for a, b in PAIRS]


def build_model(directory: Path) -> Path:
    """The random-weight model and its tokenizer saved in `directory` (built once, then reused)."""
    if (directory / "config.json").exists():
        return directory
    corpus = WARM_START_CORPORA.get("synthetic_tools").conversations(Config(), 3000, 1000, set())
    texts = render_texts((t.conversation, t.tools) for t in corpus)
    tokenizer = build_tokenizer(TinyModelConfig(vocab_size=VOCAB), texts)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_tasks(path: Path) -> Path:
    """The prompts as MiniMind-format rows (minirl's data=jsonl), no tools, the sum as ground truth."""
    rows = [{"conversations": [{"role": "user", "content": q}], "gt": [a]} for q, a in zip(QUESTIONS, ANSWERS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def parameters(directory: Path) -> int:
    return sum(p.numel() for p in Qwen2ForCausalLM.from_pretrained(directory).parameters())


def minirl_overrides(model_dir: Path, tasks: Path, run_dir: Path) -> list[str]:
    """`python -m minirl.train` overrides for the same work: no tool offered (the rows carry none), one turn,
    every group kept (no dynamic sampling or guidance: TRL trains on every group), constant lr, held-out
    evaluation only at the start and the end (outside the timed steps)."""
    return [
        f"model.name_or_path={model_dir}", "data=jsonl", f"data.path={tasks}", f"data.heldout_path={tasks}",
        f"data.heldout_size={PROMPTS}", "rollout.max_turns=1", f"rollout.group_size={GROUP}",
        f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "rollout.temperature=1.0", f"trainer.prompts_per_step={PROMPTS}",
        f"trainer.steps={STEPS}", f"loss.beta={BETA}", "loss.kl_estimator=k3", "loss.agg=token-mean",
        f"trainer.lr={LR}", "trainer.lr_schedule=constant", "algo.dynamic_sampling=false", "algo.guide=false",
        f"trainer.eval_every={STEPS}", f"trainer.micro_batch_size={PROMPTS * GROUP}", "trainer.save_final=false",
        "logger.backend=none", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
