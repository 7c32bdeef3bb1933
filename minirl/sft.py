"""`python -m minirl.sft [overrides]`: supervised fine-tuning on `sft.corpus` conversations, saved to the run
directory's `checkpoint/` (minirl/training/sft.py has the recipe; the tiny model's build runs the same one).

python -m minirl.sft                                  # the untrained tiny model, the default corpus
python -m minirl.sft model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct sft.epochs=1
"""

from pathlib import Path

from minirl.entry import cli


def run_sft(cfg, console) -> None:
    """Build or fetch the base model (`model_path`), SFT it on `sft.corpus` and save it to the run directory."""
    # late: this module is also the command's shell, which must not load torch before the config is checked
    from minirl.bootstrap import model_path
    from minirl.models.loading import load_model, load_tokenizer
    from minirl.runtime import resolve_device, seed_everything
    from minirl.training.sft import sft_examples, train_sft
    from minirl.validate import validate

    validate(cfg)  # every name resolved before the base model is built or loaded
    # on the tiny model: the cached warm start exactly
    seed_everything(cfg.trainer.seed, cfg.trainer.deterministic, cfg.trainer.threads)
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
    cli("minirl.sft:run_sft")  # this module again, imported as minirl.sft once the config is valid
