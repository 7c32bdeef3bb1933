"""The embedded tiny model: a byte-level BPE tokenizer trained here on synthetic tool
conversations, with the chat and tool tags as single tokens, and a Qwen2ForCausalLM of a few
million parameters. Both are saved with `save_pretrained` and loaded back through the same
Auto* path as any hub model or local checkpoint. Everything is deterministic from the seed.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from minirl.config import TinyModelConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Tool and reasoning tags: single tokens, kept when decoding (not "special"), as in Qwen2.5.
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def chat_template() -> str:
    return resources.files("minirl.models").joinpath("chat_template.jinja").read_text()


def _wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    wrapped.chat_template = chat_template()
    return wrapped


def _qwen2_pre_tokenizer(split_capitalised: bool) -> pre_tokenizers.PreTokenizer:
    steps = [pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False)]
    if split_capitalised:
        steps.append(pre_tokenizers.Split(Regex(r"\p{Lu}\p{L}*"), behavior="isolated", invert=False))
    return pre_tokenizers.Sequence([*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _byte_level_tokenizer(vocab_size: int, corpus: Iterable[str] | None) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    # Qwen2's normalisation and pre-tokenisation, exactly: AutoTokenizer loads any model_type
    # "qwen2" checkpoint through Qwen2Tokenizer, which rebuilds this pipeline rather than reading
    # it from tokenizer.json, so merges learned under another one would not round-trip. Its regex
    # also makes every digit a token of its own, so a number copied from a tool result into the
    # answer is the same token sequence in both places.
    tokenizer.normalizer = normalizers.NFC()
    # Merges are learned with capitalised words split from what precedes them, so no token joins
    # a capital letter to a space, quote or slash: "USD" in ` one USD?` and in
    # `"from_currency": "USD"` (or "Chicago" in `in Chicago` and `"America/Chicago"`) is then one
    # and the same token, and putting a name from the question into a call is a plain copy.
    # Lower-case words keep their leading space, so prose stays short. Qwen2's own pre-tokeniser
    # applies these merges unchanged: it only ever sees them inside its pieces.
    tokenizer.pre_tokenizer = _qwen2_pre_tokenizer(split_capitalised=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus or [""], trainer)
    tokenizer.pre_tokenizer = _qwen2_pre_tokenizer(split_capitalised=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return tokenizer


def render_texts(conversations: Iterable[tuple[list[dict], list[dict]]]) -> list[str]:
    """Chat-template text of (messages, tools) pairs, rendered with a bytes-only tokenizer."""
    renderer = _wrap(_byte_level_tokenizer(len(pre_tokenizers.ByteLevel.alphabet()) + 16, None))
    return [renderer.apply_chat_template(m, tools=t or None, tokenize=False) for m, t in conversations]


def build_tokenizer(cfg: TinyModelConfig, corpus: list[str]) -> PreTrainedTokenizerFast:
    """BPE merges learned from `corpus` (rendered chat text); tags and turn markers are single tokens."""
    # The tags are added after training, so learn merges on the text between them.
    pieces = corpus
    for tag in SPECIAL_TOKENS + TAG_TOKENS:
        pieces = [part for text in pieces for part in text.split(tag)]
    return _wrap(_byte_level_tokenizer(cfg.vocab_size, pieces))


def pretrain_copying(model: Qwen2ForCausalLM, cfg: TinyModelConfig, on_step=None) -> float:
    """Teach a fresh model to copy: random token strings of random length, each followed by a
    repeat of itself, with the loss on the repeat. Returns the final loss.

    Tool use is mostly copying (arguments from the question into the call, values from the tool
    result into the answer). A model this small, trained from scratch on a few thousand
    conversations, does not find the attention circuit for it (an induction head) within a CPU
    budget. Here it appears after about 400 steps; the varying length makes it a real lookup
    rather than a fixed-offset shortcut. With it, SFT reaches a 2.5x lower loss in the same time.
    """
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    first_id = len(SPECIAL_TOKENS)  # never the turn markers
    model.train()
    loss = float("nan")
    for step in range(cfg.copy_pretrain_steps):
        n = int(torch.randint(6, 30, (1,), generator=generator))
        half = torch.randint(first_id, model.config.vocab_size, (64, n), generator=generator)  # [B, n]
        ids = torch.cat([half, half], dim=1)  # [B, 2n]
        labels = ids.clone()
        labels[:, : n + 1] = -100  # the second copy's first token is not predictable; the rest are
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = out.loss.item()
        if on_step is not None:
            on_step(step + 1, cfg.copy_pretrain_steps, loss)
    model.eval()
    return loss


def build_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    return Qwen2ForCausalLM(config)
