"""Build, warm-start and cache the embedded tiny model: the step every entry point (train, sft, eval,
serve) runs before it loads `model.name_or_path=tiny` (`model_path`), with a progress bar per stage.

The cache directory's name is a hash of everything the result depends on (the tiny-model and
SFT configs, the warm-start corpus among them, the data split, and the source of the code that
generates the corpus and the model),
so a changed setting or generator builds a fresh model instead of reusing a stale one. Each
stage is written to a temporary directory and renamed into place, so a crash never leaves a
half-written checkpoint that looks complete. Each stage's directory also holds `BUILD_RECORD`, what
its training measured (final loss, steps, seconds), which the preset checks compare with the docs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import torch
from rich.progress import Progress, TextColumn

from minirl.config import Config, DType
from minirl.data import WARM_START_CORPORA
from minirl.models.loading import load_model, load_tokenizer
from minirl.models.tiny import build_model, build_tokenizer, pretrain_copying, render_texts
from minirl.runtime import resolve_device
from minirl.training.sft import sft_examples, train_sft

BUILD_RECORD = "minirl_build.json"
# files whose source decides what the built model is, besides those of the warm-start corpus
_SOURCES = [("minirl.models", "tiny.py"), ("minirl.models", "chat_template.jinja")]
# files whose source decides what any warm start learns, besides those of its corpus
_WARM_START_SOURCES = [
    ("minirl.training", "sft.py"),
    ("minirl.protocol", "chat.py"),  # where SFT finds the assistant tokens it trains on
]


def cache_key(cfg: Config) -> str:
    """The embedded model's cache directory name: a hash of its shape, its sources and its warm start's inputs."""
    h = hashlib.sha256(json.dumps(dataclasses.asdict(cfg.model.tiny), sort_keys=True).encode())
    for package, name in _SOURCES:
        h.update(resources.files(package).joinpath(name).read_bytes())
    _hash_warm_start_inputs(h, cfg)
    return h.hexdigest()[:12]


def warm_start_key(cfg: Config) -> str:
    """The cache directory name of a warm start of `model.name_or_path` (not the tiny model): a hash of the model
    (its hub id, or its local directory's file names, sizes and modification times), its dtype and template
    kwargs, and the warm start's inputs."""
    source = Path(cfg.model.name_or_path).expanduser()
    files = sorted((str(f.relative_to(source)), f.stat().st_size, f.stat().st_mtime_ns) for f in source.rglob("*"))
    model = {"model": cfg.model.name_or_path, "files": files, "dtype": cfg.model.dtype}
    model["chat_template_kwargs"] = cfg.model.chat_template_kwargs
    h = hashlib.sha256(json.dumps(model, sort_keys=True, default=str).encode())
    _hash_warm_start_inputs(h, cfg)
    return h.hexdigest()[:12]


def _hash_warm_start_inputs(h, cfg: Config) -> None:
    """Add what a warm start learns from to `h`: the SFT settings, the data split whose held-out prompts it leaves
    out, the source of the code that generates and renders its conversations, and sft.path's bytes."""
    settings = {
        "sft": dataclasses.asdict(cfg.sft),
        "data": [
            cfg.data.name,
            cfg.data.seed,
            cfg.data.train_size,
            cfg.data.heldout_size,
            cfg.data.path,
            cfg.data.phrasings,
        ],
    }
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for package, name in [*_WARM_START_SOURCES, *WARM_START_CORPORA.get(cfg.sft.corpus).sources]:
        h.update(resources.files(package).joinpath(name).read_bytes())
    if cfg.sft.path is not None and Path(cfg.sft.path).is_file():  # a missing one: the corpus says so
        h.update(Path(cfg.sft.path).read_bytes())


def _save_atomically(target: Path, model, tokenizer, record: dict) -> None:
    """The model and tokenizer, with `record` as BUILD_RECORD, in `target` at once or not at all."""
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    try:
        os.replace(tmp, target)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)


def _run_with_progress(console, label: str, train) -> float:
    """Run `train(on_step)` under a progress bar; returns its final loss."""
    columns = (*Progress.get_default_columns(), TextColumn("loss {task.fields[loss]:.3f}"))
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(label, total=None, loss=float("nan"))
        return train(lambda step, total, loss: bar.update(task, completed=step, total=total, loss=loss))


def _build_base(cfg: Config, target: Path, console) -> None:
    tiny = cfg.model.tiny
    corpus = WARM_START_CORPORA.get(cfg.sft.corpus)
    tasks = corpus.conversations(cfg, tiny.tokenizer_corpus_rows, tiny.seed + 1000, set())
    tokenizer = build_tokenizer(tiny, render_texts((t.conversation, t.tools) for t in tasks))
    model = build_model(tiny, tokenizer)
    start = time.perf_counter()
    loss = _run_with_progress(console, "copy pretraining", lambda on_step: pretrain_copying(model, tiny, on_step))
    elapsed = time.perf_counter() - start
    console.print(f"copy pretraining: {tiny.copy_pretrain_steps} steps in {elapsed:.0f}s, final loss {loss:.3f}")
    record = {"stage": "copy pretraining", "steps": tiny.copy_pretrain_steps, "final_loss": loss, "seconds": elapsed}
    _save_atomically(target, model, tokenizer, record)


def _warm_start(cfg: Config, base: str, target: Path, console, dtype: DType = DType.float32) -> None:
    """SFT the model at `base` on sft.corpus in `dtype` and save it at `target`, with its BUILD_RECORD."""
    device = resolve_device(cfg.trainer.device, cfg.trainer.deterministic)
    typed = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))
    model, tokenizer = load_model(base, typed, device), load_tokenizer(base, cfg)
    examples = sft_examples(tokenizer, cfg)
    console.print(
        f"[bold]warm start[/]: no cached SFT checkpoint; training on {len(examples)} {cfg.sft.corpus} conversations "
        f"for {cfg.sft.epochs} epochs (cached in {target.parent})"
    )
    start = time.perf_counter()
    loss = _run_with_progress(
        console, "SFT", lambda on_step: train_sft(model, tokenizer, examples, cfg.sft, device, on_step=on_step)
    )
    elapsed = time.perf_counter() - start
    console.print(f"warm start done in {elapsed:.0f}s, final epoch loss {loss:.3f}")
    record = {
        "stage": "warm start",
        "corpus": cfg.sft.corpus,
        "conversations": len(examples),
        "epochs": cfg.sft.epochs,
        "final_epoch_loss": loss,
        "seconds": elapsed,
    }
    _save_atomically(target, model, tokenizer, record)


@contextmanager
def _deterministic_algorithms(enabled: bool):
    """torch.use_deterministic_algorithms(enabled) inside, the caller's setting after: a build's float sums
    then run in a fixed order whichever command (train, sft, eval, serve) builds the cached model."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def ensure_tiny(cfg: Config, console, warm: bool) -> Path:
    """Directory of the tiny model: the warm-started one if `warm`, else the untrained base."""
    root = Path(cfg.model.cache_dir).expanduser() / f"tiny-{cache_key(cfg)}"
    root.mkdir(parents=True, exist_ok=True)
    base, sft = root / "base", root / "sft"
    with _deterministic_algorithms(cfg.trainer.deterministic):
        if not (base / "config.json").exists():
            console.print(f"building the embedded tiny model in {root}")
            _build_base(cfg, base, console)
        if warm and not (sft / "config.json").exists():  # float32 whatever model.dtype (not in the cache key)
            _warm_start(cfg, str(base), sft, console)
    return sft if warm else base


def ensure_warm_start(cfg: Config, console) -> Path:
    """Directory of `model.name_or_path` after SFT on sft.corpus in model.dtype, made when not cached yet."""
    target = Path(cfg.model.cache_dir).expanduser() / f"warm-start-{warm_start_key(cfg)}" / "sft"
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with _deterministic_algorithms(cfg.trainer.deterministic):
            _warm_start(cfg, cfg.model.name_or_path, target, console, cfg.model.dtype)
    return target


def model_path(cfg: Config, console, warm_start: bool = True) -> str:
    """What `model.name_or_path` loads from: for `tiny` the cached build, warm-started unless model.warm_start is
    false; for any other model itself, or with model.warm_start=true its cached warm start (ensure_warm_start).
    Builds and warm starts are made here when missing; `warm_start=False` skips the warm start (python -m
    minirl.sft runs its own)."""
    if cfg.model.name_or_path == "tiny":
        return str(ensure_tiny(cfg, console, warm=warm_start and cfg.model.warm_start is not False))
    if warm_start and cfg.model.warm_start:
        return str(ensure_warm_start(cfg, console))
    return cfg.model.name_or_path
