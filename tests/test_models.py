"""The embedded tiny model: deterministic build, the Auto* loading path, and the SFT loss mask."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from support import CALC_TOOL, CONVERSATION, debug_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.bootstrap import ensure_tiny
from minirl.config import Config, TinyModelConfig
from minirl.data.synthetic_tools import sft_rows
from minirl.data.task import task_from_row
from minirl.errors import ConfigError
from minirl.models.loading import load_model, load_tokenizer
from minirl.models.tiny import build_model, build_tokenizer, render_texts
from minirl.protocol.chat import render
from minirl.runtime import choose_cuda_attention, resolve_device
from minirl.training.sft import assistant_token_loss, collate, tokenize_conversation

SMALL = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def test_build_is_deterministic_from_the_seed():
    corpus = render_texts([(CONVERSATION, [CALC_TOOL])] * 10)
    a, b = build_tokenizer(SMALL, corpus), build_tokenizer(SMALL, corpus)
    assert a.get_vocab() == b.get_vocab()
    ma, mb = build_model(SMALL, a), build_model(SMALL, b)
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    other = build_model(TinyModelConfig(**{**SMALL.__dict__, "seed": 1}), a)
    assert not torch.equal(ma.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_saved_model_loads_back_by_path_through_auto_classes(tmp_path, tokenizer):
    model = build_model(SMALL, tokenizer).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    auto_tok = AutoTokenizer.from_pretrained(tmp_path)
    auto_model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(auto_model).__name__ == "Qwen2ForCausalLM"
    text = auto_tok.apply_chat_template(CONVERSATION, tools=[CALC_TOOL], tokenize=False)
    assert text == tokenizer.apply_chat_template(CONVERSATION, tools=[CALC_TOOL], tokenize=False)
    ids = torch.tensor([auto_tok.encode("<tool_call>hello</tool_call>")])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, auto_model(ids).logits)
    # the trainer's loader takes the same path string a hub id would be
    cfg = Config()
    loaded, loaded_tok = load_model(str(tmp_path), cfg, torch.device("cpu")), load_tokenizer(str(tmp_path), cfg)
    assert loaded.training and all(p.requires_grad for p in loaded.parameters())
    assert loaded_tok.eos_token == "<|im_end|>" and loaded_tok.pad_token == "<|endoftext|>"


@pytest.mark.fast
@pytest.mark.usefixtures("any_template_tokenizer")
def test_sft_mask_covers_assistant_tokens_and_end_of_turn_only(any_template_tokenizer):
    tok = any_template_tokenizer
    example = tokenize_conversation(tok, CONVERSATION, [CALC_TOOL])
    assert len(example.input_ids) == len(example.loss_mask)
    spans, current = [], []
    for token, m in zip(example.input_ids, example.loss_mask):
        if m:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    assert len(spans) == 2  # the tool-calling turn and the final answer
    for span in spans:
        assert span[-1] == tok.eos_token_id  # the model learns to stop
        assert span.count(tok.eos_token_id) == 1
    assert "calculate_math" in tok.decode(spans[0]) and "9472" in tok.decode(spans[1])
    masked_out = tok.decode([t for t, m in zip(example.input_ids, example.loss_mask) if not m])
    assert "<tool_response>" in masked_out and "What is 256 * 37" in masked_out


def test_assistant_token_loss_equals_the_full_sequence_loss_with_system_parts_shared(tiny_policy):
    model, tokenizer, _ = tiny_policy
    corpus = [task_from_row(row, "corpus") for row in sft_rows(60, seed=0, exclude_prompts=set())]
    first, second = [t.tools for t in corpus if t.tools][:2]
    assert first != second
    # rows 0-1 and 2-3 share their system parts (each encoded once), row 4 (no tools) has its own
    tasks = [t for t in corpus if t.tools == first][:2] + [t for t in corpus if t.tools == second][:2]
    tasks.append(next(t for t in corpus if not t.tools))
    assert len(tasks) == 5
    examples = [tokenize_conversation(tokenizer, t.conversation, t.tools) for t in tasks]
    system = torch.tensor([e.system_length for e in examples])
    assert all(system > 0)
    assert examples[0].input_ids[: system[0]] == examples[1].input_ids[: system[1]]
    system_part = render(tokenizer, tasks[0].conversation[:1], tasks[0].tools, add_generation_prompt=False)
    assert examples[0].input_ids[: system[0]] == system_part
    ids, attention, labels, lengths = collate(examples, tokenizer.pad_token_id)
    assert torch.equal(lengths, system)
    assert (labels[:, :20] == -100).all()  # the prompt is context: there is something to skip

    def gradient(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    expected = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    expected_grad = gradient(expected)
    loss = assistant_token_loss(model, ids, attention, labels, system)
    assert torch.allclose(loss, expected, atol=1e-5)
    assert torch.allclose(gradient(loss), expected_grad, atol=1e-5)  # the shared system parts get every row's share
    model.zero_grad(set_to_none=True)


@pytest.mark.fast
def test_names_from_the_question_are_the_same_tokens_inside_a_call():
    """A capitalised word never merges with what precedes it, so copying it into JSON is exact."""
    pairs = [
        ("How many CNY do I get for one USD?", '{"from_currency": "USD"}', "USD"),
        ("What time is it in Chicago?", '{"timezone": "America/Chicago"}', "Chicago"),
        ("What is the weather in Paris?", '{"city": "Paris"}', "Paris"),
    ]
    tokenizer = build_tokenizer(SMALL, [text for pair in pairs for text in pair[:2]] * 50)
    for question, call, name in pairs:
        name_ids = tokenizer.encode(name)
        assert len(name_ids) == 1  # the corpus made it a word of its own
        for text in (question, call):
            assert name_ids[0] in tokenizer.encode(text), (text, name)


@pytest.fixture
def attention_switches():
    """The process-wide attention kernel switches, restored after the test."""
    cuda = torch.backends.cuda
    saved = cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled()
    yield lambda: (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled())
    cuda.enable_cudnn_sdp(saved[0])
    cuda.enable_flash_sdp(saved[1])
    cuda.enable_mem_efficient_sdp(saved[2])


@pytest.mark.fast
@pytest.mark.parametrize(
    "deterministic, expected",
    [(True, (False, False, False)), (False, (False, True, True))],  # (cuDNN, flash, memory-efficient) on
)
def test_a_cuda_device_picks_attention_kernels_and_a_cpu_device_leaves_them(
    attention_switches, deterministic, expected
):
    # the CPU attention kernels read the same switches, so a CPU run must not flip them (its numerics would change);
    # choosing the CUDA kernels touches no GPU, so this runs anywhere
    before = attention_switches()
    assert resolve_device("cpu", deterministic) == torch.device("cpu")
    assert attention_switches() == before
    if torch.cuda.is_available():
        assert resolve_device("cuda:0", deterministic) == torch.device("cuda:0")
    else:
        with pytest.raises(ConfigError, match=r"^trainer.device=cuda:0: no cuda device here"):
            resolve_device("cuda:0", deterministic)
        assert attention_switches() == before
        choose_cuda_attention(deterministic)  # what resolve_device does for a CUDA device
    assert attention_switches() == expected


@pytest.fixture
def nondeterministic_torch():
    """torch's deterministic mode off for the test (a training test may have left it on), restored after."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_the_cached_warm_start_is_float32_whatever_model_dtype_asks(tmp_path, nondeterministic_torch):
    """model.dtype is not in the cache key, so the warm start must not depend on it: a bfloat16 policy's first run
    builds the same float32 checkpoint as a float32 run's. The two builds run in one process, one after the other,
    with torch's deterministic mode off outside them: the build must be deterministic by itself, whoever calls it."""
    built = {}
    for dtype in ("bfloat16", "float32"):
        cfg = debug_config(tmp_path / dtype, tmp_path / f"run-{dtype}", f"model.dtype={dtype}")
        built[dtype] = load_file(ensure_tiny(cfg, Console(quiet=True), warm=True) / "model.safetensors")
        assert not torch.are_deterministic_algorithms_enabled()  # the caller's setting is back
    assert built["bfloat16"].keys() == built["float32"].keys()
    for name, tensor in built["bfloat16"].items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, built["float32"][name]), name


def test_the_sft_command_reproduces_the_cached_warm_start(tmp_path):
    """`python -m minirl.sft` on the tiny model: SFT of the cached base, saved to the run directory, equal bit for
    bit to the warm start `python -m minirl.train` builds and caches (the same recipe, whichever command runs it)."""
    cache, run = tmp_path / "cache", tmp_path / "run"
    cmd = [sys.executable, "-m", "minirl.sft", "debug=cpu", f"model.cache_dir={cache}", f"hydra.run.dir={run}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "final SFT loss" in proc.stdout and not list(cache.glob("tiny-*/sft"))  # only the base was built
    trained = load_file(run / "checkpoint" / "model.safetensors")
    cached = load_file(
        ensure_tiny(debug_config(cache, tmp_path / "train"), Console(quiet=True), warm=True) / "model.safetensors"
    )
    assert trained.keys() == cached.keys()
    for name, tensor in trained.items():
        assert torch.equal(tensor, cached[name]), name
    tokenizer = AutoTokenizer.from_pretrained(run / "checkpoint")  # loads back by path like any checkpoint
    assert tokenizer.convert_tokens_to_ids("<tool_call>") != tokenizer.unk_token_id
