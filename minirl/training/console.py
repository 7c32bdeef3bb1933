"""What a run prints: one line per step, one per held-out evaluation, and its warnings."""

from __future__ import annotations


def step_line(step: int, steps: int, metrics: dict[str, float]) -> str:
    """`step  n/N  reward ± std  success  kl  valid calls  turns  groups (guided)  seconds`."""
    groups = f"groups {metrics['algo/groups_kept']:.0f}"
    if metrics["algo/groups_guided"]:
        groups += f" ({metrics['algo/groups_guided']:.0f} guided)"
    return (
        f"step {step:>4}/{steps}  reward {metrics['reward/mean']:+.2f} "
        f"± {metrics['reward/std']:.2f}  success {metrics['rollout/success_rate']:.0%}  "
        f"kl {metrics.get('loss/kl', 0.0):.4f}  valid calls {metrics['tools/valid_frac']:.0%}  "
        f"turns {metrics['rollout/turns']:.2f}  {groups}  {metrics['time/step_s']:.1f}s"
    )


def eval_line(step: int, metrics: dict[str, float], tasks: int, change: str) -> str:
    """The held-out success overall and by kind, and the mean reward; `change` says what moved since step 0."""
    kinds = "  ".join(
        f"{k.rsplit('/', 1)[-1]} {v:.0%}" for k, v in metrics.items() if k.startswith("eval/success_rate/")
    )
    return (
        f"[bold cyan]eval[/] step {step:>4}: held-out success {metrics['eval/success_rate']:.1%} "
        f"({tasks} tasks; {kinds}), reward {metrics['eval/reward/mean']:+.2f}{change}"
    )


def skipped_rows_warning(skipped: list[str]) -> str:
    """How many malformed dataset rows were left out (`path:lineno: reason` each), quoting the first."""
    return (
        f"[bold yellow]warning[/]: skipped {len(skipped)} malformed dataset rows (data.on_error=skip); "
        f"first: {skipped[0]}"
    )


def stale_sync_warning(step: int, engine: str, gap: float, gap_prev: float) -> str:
    """The engine scored a sequence no closer to the updated weights than to the ones before (sync_check.py)."""
    return (
        f"[bold red]warning[/]: step {step}: the {engine} engine is not sampling from the updated weights: "
        f"its log-probs of a sampled sequence lie {gap:.2e} nats/token from the trainer's new weights and "
        f"{gap_prev:.2e} from the weights before the update. The weight sync did not reach the sampler; the "
        f"rollouts come from old weights (rollout.sync_check_every)"
    )


def emulated_bf16_warning(kernels: str) -> str:
    """bfloat16 asked for on a CPU whose kernels (`kernels`: torch's CPU capability) emulate it
    (minirl.runtime.bf16_emulated)."""
    return (
        "[bold red]warning[/]: bfloat16 (model.dtype or trainer.bf16_autocast) on a CPU without bf16 kernels "
        f"(torch's are {kernels}): bf16 math is emulated here, and `make bench`'s update took 26x as long under "
        "bf16 autocast as in float32 on such a CPU (experiments/README.md); float32 is faster on this machine"
    )


def construction_line(construction: str, tool_rounds: int | None) -> str:
    """Which next-prompt construction the chat template needs, and for how many tool rounds in a row (None: any
    number; minirl/protocol/chat.py)."""
    how = {
        "prefix": "the template keeps earlier turns as rendered",
        "delta": "the template re-renders earlier turns, so appended messages are rendered against a fixed base",
        "calls": "the template renders a tool message only after a call, so the placeholder carries the turn's calls",
    }[construction]
    rounds = "" if tool_rounds is None else f", for at most {tool_rounds} tool round(s) in a row"
    return f"next prompts: the {construction} construction ({how}){rounds}"
