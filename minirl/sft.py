"""`python -m minirl.sft [overrides]`: supervised fine-tuning on `sft.corpus` conversations, saved to the run
directory's `checkpoint/` (minirl/training/sft.py has the recipe; the tiny model's build runs the same one).

python -m minirl.sft                                  # the untrained tiny model, the default corpus
python -m minirl.sft model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct sft.epochs=1
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from minirl.entry import launch, run_entry


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(dict_cfg: DictConfig) -> None:
    run_entry(dict_cfg, _run_sft)


def _run_sft(cfg, console) -> None:
    # after the config is validated: torch and friends load slowly
    from pathlib import Path

    from minirl.bootstrap import model_path
    from minirl.models.loading import load_model, load_tokenizer
    from minirl.runtime import resolve_device, seed_everything
    from minirl.training.sft import sft_examples, train_sft

    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)  # on the tiny model: the cached warm start exactly
    device = resolve_device(cfg.trainer.device, cfg.trainer.deterministic)
    path = model_path(cfg, console, warm_start=False)
    model, tokenizer = load_model(path, cfg, device), load_tokenizer(path, cfg)
    examples = sft_examples(tokenizer, cfg)
    console.print(f"SFT on {len(examples)} {cfg.sft.corpus} conversations, {cfg.sft.epochs} epochs")
    loss = train_sft(model, tokenizer, examples, cfg.sft, device)
    out = Path(cfg.output_dir) / "checkpoint"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    console.print(f"final SFT loss {loss:.4f}; saved to {out}")


if __name__ == "__main__":
    launch(main)
