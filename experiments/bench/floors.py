"""The raw floors of one step of the bench's single-turn work on this machine, in plain transformers/torch;
prints them as JSON.

    python experiments/bench/floors.py MODEL_DIR [--bf16]

- decode: one batched KV-cache sampling (`model.generate`) of PROMPTS x GROUP rows, exactly MAX_NEW_TOKENS each;
- train: on the same rows (prompt + MAX_NEW_TOKENS tokens), one reference forward without gradients, then one
  policy forward, a token-mean log-prob loss, backward and an AdamW step.

Each is timed REPEATS times after a warm-up; the medians are printed. No RL framework is below these. With
--bf16 both run under bf16 autocast (the weights, gradients and AdamW state stay float32).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import workload
from transformers import AutoModelForCausalLM, AutoTokenizer

REPEATS = 5


def timed(fn, repeats: int = REPEATS) -> float:
    fn()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    model_dir = sys.argv[1]
    precision = torch.autocast("cpu", torch.bfloat16, enabled="--bf16" in sys.argv[2:])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in workload.QUESTIONS for _ in range(workload.GROUP)
    ]  # fmt: skip
    tokenizer.padding_side = "left"
    prompts = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)

    @torch.no_grad()
    def decode():
        policy.eval()
        return policy.generate(
            **prompts, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=workload.MAX_NEW_TOKENS,
            min_new_tokens=workload.MAX_NEW_TOKENS, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip

    rows = decode()  # [N, prompt + MAX_NEW_TOKENS]
    new = torch.ones(len(rows), workload.MAX_NEW_TOKENS, dtype=torch.long)
    attention = torch.cat([prompts["attention_mask"], new], dim=1)
    start = prompts["input_ids"].shape[1] - 1
    optimizer = torch.optim.AdamW(policy.parameters(), lr=workload.LR)

    def token_logp(model):
        logits = model(input_ids=rows, attention_mask=attention, logits_to_keep=rows.shape[1] - start).logits[:, :-1]
        return logits.log_softmax(-1).gather(-1, rows[:, start + 1 :, None]).squeeze(-1)  # [N, MAX_NEW_TOKENS]

    def train():
        with torch.no_grad():
            ref = token_logp(reference)
        policy.train()
        logp = token_logp(policy)
        loss = -(logp * 0.1).mean() + workload.BETA * (logp - ref).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with precision:
        decode_s, train_s = timed(decode), timed(train)
    tokens = {"rows": len(rows), "prompt_tokens": prompts["input_ids"].shape[1], "new_tokens": workload.MAX_NEW_TOKENS}
    print(json.dumps({"system": "floor", "decode_s": decode_s, "train_s": train_s, **tokens}))


if __name__ == "__main__":
    main()
