"""LoRA through peft (model.lora.r > 0) with the real trainer on the debug preset: only the adapters train and are
saved, the reference is the policy's own storage with its adapters off, what a plain-weights sampler (vLLM) gets is
the merged model, a run resumes exactly from adapter checkpoints, and the final checkpoint loads merged or as base
plus adapters, and serves."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from rich.console import Console
from support import debug_config, start_server
from transformers import AutoModelForCausalLM

from minirl.bootstrap import model_path
from minirl.errors import ConfigError
from minirl.inference.adapters import AdaptersOff, adapter_layers, adapters_off, plain_state_dict
from minirl.models.loading import load_model
from minirl.trainer import Trainer, train

LORA = ("model.lora.r=4", "model.lora.alpha=8")


def lora_trainer(cache_dir, run_dir, *overrides: str) -> tuple[Trainer, str]:
    cfg = debug_config(cache_dir, run_dir, *LORA, *overrides)
    path = model_path(cfg, Console(quiet=True))
    return Trainer(cfg, path, Console(quiet=True)), path


def perturb_adapters(model: torch.nn.Module) -> None:
    """Give every adapter a non-zero update (peft starts B at 0, where the adapters change nothing)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in adapter_layers(model).values():
            weight = layer.lora_B["default"].weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.05)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])


def test_the_reference_is_the_policys_own_storage_with_its_adapters_off(cache_dir, tmp_path):
    trainer, path = lora_trainer(cache_dir, tmp_path)
    policy, reference = trainer.policy, trainer.reference
    assert isinstance(reference, AdaptersOff)
    policy_storage = {p.data_ptr() for p in policy.parameters()}
    assert {p.data_ptr() for p in reference.parameters()} <= policy_storage  # no second model allocated
    trained = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in name for name in trained)
    assert {id(p) for group in trainer.learner.optimizer.param_groups for p in group["params"]} == {
        id(p) for p in policy.parameters() if p.requires_grad
    }  # the optimizer holds the adapters alone
    perturb_adapters(policy)
    base = load_model(path, trainer.cfg, torch.device("cpu"), trainable=False)
    assert torch.allclose(logits(reference, IDS), logits(base, IDS), atol=1e-6)
    assert not torch.allclose(logits(policy, IDS), logits(base, IDS), atol=1e-4)  # the policy keeps its adapters
    with adapters_off(policy):
        assert torch.allclose(logits(policy, IDS), logits(base, IDS), atol=1e-6)
    assert not torch.allclose(logits(policy, IDS), logits(base, IDS), atol=1e-4)  # back on after


def test_training_changes_the_adapters_and_nothing_else(cache_dir, tmp_path):
    trainer, _ = lora_trainer(cache_dir, tmp_path, "trainer.steps=3")
    before = {name: p.detach().clone() for name, p in trainer.policy.named_parameters()}
    trainer.fit()
    after = dict(trainer.policy.named_parameters())
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert changed and all(".lora_" in name for name in changed)
    assert any("lora_B" in name for name in changed)  # the update moved the adapters off their zero start
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("loss/kl", 0) > 0 for row in rows)  # the KL to the adapters-off reference


def test_a_sampler_of_plain_weights_gets_the_merged_model(cache_dir, tmp_path):
    trainer, path = lora_trainer(cache_dir, tmp_path)
    perturb_adapters(trainer.policy)
    merged = plain_state_dict(trainer.policy)
    plain = load_model(path, trainer.cfg, torch.device("cpu"), trainable=False)
    assert set(merged) == set(plain.state_dict())  # the names vLLM's model loads
    plain.load_state_dict(merged)
    assert torch.allclose(logits(plain, IDS), logits(trainer.policy, IDS), atol=1e-5)
    assert all(".lora_" not in name for name in merged)


@pytest.mark.slow
def test_a_lora_run_resumed_from_its_adapter_checkpoint_repeats_the_whole_run(cache_dir, tmp_path):
    common = ("trainer.lr_schedule=constant", "trainer.save_every=1")
    whole = train(debug_config(cache_dir, tmp_path / "whole", *LORA, "trainer.steps=4", *common))
    train(debug_config(cache_dir, tmp_path / "cut", *LORA, "trainer.steps=2", *common))
    assert (tmp_path / "cut" / "checkpoints" / "step_000002" / "adapter_config.json").is_file()  # adapters alone
    resumed = train(debug_config(cache_dir, tmp_path / "cut", *LORA, "trainer.steps=4", "trainer.resume=auto", *common))

    def rows(run: str) -> list[dict]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in lines]

    assert rows("cut") == rows("whole")
    assert resumed.eval_history == whole.eval_history


@pytest.mark.slow
def test_the_final_lora_checkpoint_loads_merged_or_as_base_plus_adapters_and_serves(cache_dir, tmp_path):
    trainer, _ = lora_trainer(cache_dir, tmp_path / "run", "trainer.steps=1")
    perturb_adapters(trainer.policy)  # so that the merge shows: one debug step moves the adapters very little
    trainer.cfg.trainer.steps = 0  # fit writes the final checkpoint of the policy as it is
    trainer.fit()
    final = tmp_path / "run" / "checkpoint"
    want = logits(trainer.policy, IDS)
    merged = AutoModelForCausalLM.from_pretrained(final)  # a plain model: config.json and merged weights
    assert not adapter_layers(merged) and torch.allclose(logits(merged, IDS), want, atol=1e-5)
    adapters = AutoModelForCausalLM.from_pretrained(final / "adapter")  # the base its config names, plus adapters
    assert adapter_layers(adapters) and torch.allclose(logits(adapters, IDS), want, atol=1e-5)

    server = start_server(tmp_path / "serve", f"model.name_or_path={final}")
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)
        reply = client.chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": "What is 2 + 3?"}], max_tokens=8
        )
        assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lora.target_modules=[no_such_proj]", "model.lora.target_modules: Target modules"),
        ("model.lora.r=-1", "model.lora.r: must be >= 0"),
        ("model.lora.dropout=1.0", "model.lora.dropout: must be in [0, 1)"),
    ],
)
def test_a_wrong_lora_setting_names_its_key(cache_dir, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        lora_trainer(cache_dir, tmp_path, override)
