"""The hub model presets (minirl/conf/model/), without the hub: each preset's architecture scaled down (2 layers,
hidden 64), under the tiny tokenizer type with the preset's real chat template (the fixtures) and its special
tokens, saved with save_pretrained and trained for 2 steps loading it by path, with the preset's own settings
(dtype, template kwargs, call format), the debug preset's budgets on top.

Without the template fixtures (a user's clone) every test here skips, saying so.
"""

from __future__ import annotations

import pytest
from rich.console import Console
from support import SHAPED_REWARD, debug_config, template_tokenizer
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from minirl.config import register_configs
from minirl.protocol.chat import template_kwargs
from minirl.trainer import Trainer

register_configs()

# preset -> (the architecture of its hub model, the fixture of its chat template, its hub id)
PRESETS = {
    "qwen2.5-0.5b": ((Qwen2Config, Qwen2ForCausalLM), "qwen2_5.jinja", "Qwen/Qwen2.5-0.5B-Instruct"),
    "qwen2.5-1.5b": ((Qwen2Config, Qwen2ForCausalLM), "qwen2_5.jinja", "Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen3-0.6b": ((Qwen3Config, Qwen3ForCausalLM), "qwen3.jinja", "Qwen/Qwen3-0.6B"),
    "qwen3-1.7b": ((Qwen3Config, Qwen3ForCausalLM), "qwen3.jinja", "Qwen/Qwen3-1.7B"),
    "qwen3-4b-2507": ((Qwen3Config, Qwen3ForCausalLM), "qwen3_instruct_2507.jinja", "Qwen/Qwen3-4B-Instruct-2507"),
    "llama3.2-1b": ((LlamaConfig, LlamaForCausalLM), "llama3_2.jinja", "meta-llama/Llama-3.2-1B-Instruct"),
}
CASES = [*PRESETS, "qwen3-0.6b-no-think"]


def scaled_down(preset: str, path) -> None:
    """The preset's architecture, 2 layers of hidden 64 (head size 32), under its template, saved at `path`."""
    (config_type, model_type), fixture, _ = PRESETS[preset]
    tokenizer = template_tokenizer(fixture)
    config = config_type(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=8192,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model_type(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.mark.parametrize("case", CASES)
def test_each_preset_trains_two_steps_on_its_scaled_down_copy_by_path(case, cache_dir, tmp_path):
    preset = case.removesuffix("-no-think")
    thinking = ["model.chat_template_kwargs.enable_thinking=false"] if case.endswith("-no-think") else []
    scaled_down(preset, tmp_path / "model")
    cfg = debug_config(cache_dir, tmp_path / "run", f"model={preset}", SHAPED_REWARD, "loss.beta=0", *thinking)
    assert PRESETS[preset][2] in str(debug_config(cache_dir, tmp_path / "x", f"model={preset}").model.name_or_path)
    cfg.model.name_or_path = str(tmp_path / "model")
    console = Console(record=True, width=300)
    trainer = Trainer(cfg, cfg.model.name_or_path, console)
    result = trainer.fit()
    assert [step for step, _ in result.eval_history] == [0, 1, 2]
    assert str(next(trainer.policy.parameters()).dtype) == "torch.bfloat16"
    kwargs = template_kwargs(trainer.tokenizer)
    assert kwargs == dict(cfg.model.chat_template_kwargs)
    assert "next prompts: the " in console.export_text()
    first = trainer.tokenizer.decode(trainer.sampler.rollout(trainer.heldout[:1], 1, 0.0)[0].prompt_ids)
    empty_think = first.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert empty_think == (
        preset.startswith("qwen3-") and "2507" not in preset and kwargs.get("enable_thinking") is False
    )
