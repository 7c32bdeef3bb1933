"""Structured configs: the schema under the YAML tree in `conf/`.

Hydra composes `conf/config.yaml` on top of `Config` (stored in the ConfigStore as
`minirl_schema`), so a wrong key or a wrong type anywhere, a group file included, fails at
composition. Range checks live in `__post_init__` and run when the entry point converts the
composed config once with `OmegaConf.to_object`; below that, code gets typed dataclasses.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from minirl.errors import ConfigError

# A sampling temperature below this decodes greedily, as in vLLM: logits divided by it could overflow float32.
GREEDY_BELOW = 1e-5
# what a device key may name (trainer.device, reward.model.device)
DEVICE_NAMES = r"auto|cpu|mps|cuda(:\d+)?"


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


# MiniMind's six mock tools (minirl/tools/minimind.py registers them): the default tool set
MINIMIND_TOOL_NAMES = (
    "calculate_math",
    "unit_converter",
    "get_current_weather",
    "get_current_time",
    "get_exchange_rate",
    "translate_text",
)


class CallPolicy(str, Enum):
    multi = "multi"  # MiniMind: several calls per turn, up to a maximum
    strict_single = "strict_single"  # ReTool: one call, nothing after it, no empty argument
    lenient = "lenient"  # MiniMind's parse: as multi, but a call that cannot be read is dropped (and counted)


class ObservationCut(str, Enum):
    """Which tokens of a tool result longer than protocol.max_tool_output_tokens the model reads."""

    head_tail = "head_tail"  # the first half and the last half: what was printed first, and where a traceback ends
    tail = "tail"  # the last tokens (ReTool: the result or the error is at the end)
    head = "head"  # the first tokens


class ThinkingUnit(str, Enum):
    """What one draw of rollout.thinking_ratio decides."""

    group = "group"  # all samples of a task alike: a group's advantages compare trajectories that saw one prompt
    trajectory = "trajectory"  # each sample on its own (MiniMind's draw)


class PhrasingSet(str, Enum):
    """Which wordings of the synthetic questions a split draws from; the warm start always uses core."""

    core = "core"  # the warm start's own wordings
    all = "all"  # seen and unseen wordings
    unseen = "unseen"  # only wordings the warm start never saw: RL must generalise


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class TinyModelConfig:
    """Shape of the embedded Qwen2 model and its locally trained byte-level BPE tokenizer."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    tokenizer_corpus_rows: int = 3000  # synthetic conversations the BPE merges are learned from
    copy_pretrain_steps: int = 700  # random-string copying before SFT (see models/tiny.py)
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            _check(getattr(self, key) > 0, f"model.tiny.{key}", "must be > 0")
        _check(self.hidden_size % self.num_heads == 0, "model.tiny.hidden_size", "must be divisible by num_heads")
        _check(self.num_heads % self.num_kv_heads == 0, "model.tiny.num_kv_heads", "must divide num_heads")


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (peft, the lora extra): with r > 0 only the adapters train and are saved, the
    reference is the same weights with the adapters off (no second model in memory), and the engines sample from
    base plus adapters (minirl/inference/adapters.py). r = 0: the whole model trains."""

    r: int = 0  # the adapters' rank; 0 = no adapters
    alpha: float = 16.0  # the update is scaled by alpha / r
    dropout: float = 0.0  # on the adapters' input, in training only
    # the linear layers that get an adapter (module names; Llama / Qwen's attention and MLP projections)
    target_modules: List[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        _check(self.r >= 0, "model.lora.r", "must be >= 0 (0 = no adapters)")
        _check(self.alpha > 0, "model.lora.alpha", "must be > 0")
        _check(0 <= self.dropout < 1, "model.lora.dropout", "must be in [0, 1)")
        _check(bool(self.target_modules), "model.lora.target_modules", "must name at least one module")


@dataclass
class ModelConfig:
    # "tiny" = the embedded model this project builds; anything else is a Hugging Face hub id or a
    # local directory written by save_pretrained (e.g. Qwen/Qwen2.5-0.5B-Instruct, ./outputs/ckpt)
    name_or_path: str = "tiny"
    dtype: DType = DType.float32
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    # SFT on sft.corpus before the run, cached in cache_dir: null = the embedded tiny model only (a model loaded by
    # name or path, a checkpoint say, is taken as it is); true = any model; false = none
    warm_start: Optional[bool] = None
    cache_dir: str = "~/.cache/minirl"  # where the tiny model and its warm start are built
    trust_remote_code: bool = False
    # passed to the chat template in every render (rollout, SFT, eval, serve), e.g. {enable_thinking: false}
    # for Qwen3; a server request's own chat_template_kwargs go over them
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    lora: LoraConfig = field(default_factory=LoraConfig)
    # recompute each layer's activations in the backward pass instead of keeping them (transformers' gradient
    # checkpointing, non-reentrant): less memory for more compute; the update then encodes every row's prompt
    gradient_checkpointing: bool = False


@dataclass
class SFTConfig:
    """Warm start on full tool trajectories (loss on assistant tokens only)."""

    # registry key (WARM_START_CORPORA): synthetic_tools | synthetic_math | jsonl (a file of a user's own
    # conversations in the agent format, sft.path); the embedded model's tokenizer and SFT data come from it
    corpus: str = "synthetic_tools"
    path: Optional[str] = None  # jsonl: the conversations, each with assistant messages after its last user message
    rows: int = 3000
    # synthetic corpora: the share of rows worded with the "extra" phrasings, which RL and held-out questions also
    # use (0: the warm start never sees them)
    extra_wording_share: float = 0.0
    epochs: int = 5
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 20
    max_length: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("rows", "epochs", "batch_size", "max_length"):
            _check(getattr(self, key) > 0, f"sft.{key}", "must be > 0")
        _check(self.lr > 0, "sft.lr", "must be > 0")
        _check(0 <= self.extra_wording_share <= 1, "sft.extra_wording_share", "must be in [0, 1]")


@dataclass
class SandboxConfig:
    """Limits of one code_interpreter run (minirl/tools/sandbox.py). There is no wall-clock key: a
    run is killed at 90% of tools.timeout_s after its call started, waiting for a worker included."""

    workers: int = 4  # interpreter processes at once; further calls wait for a free one
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU)
    memory_mb: int = 512  # address space (RLIMIT_AS)
    file_mb: int = 16  # largest file written, stdout and stderr included (RLIMIT_FSIZE); in namespaces all files
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 64  # RLIMIT_NPROC: counts all processes and threads of the user; root is exempt
    max_output_chars: int = 2048  # stdout + stderr the model sees, cut with a marker; JSON escaping adds more
    # without unprivileged namespaces nothing but an in-process audit hook stands between the code and the
    # machine's files: code_interpreter refuses to start there unless this is true
    allow_unconfined: bool = False
    # installed top-level packages the code may import besides the standard library, e.g. [numpy, sympy], each with
    # the packages it requires; their files are readable (in namespaces bound read-only into the run's root)
    packages: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for key in ("workers", "cpu_s", "file_mb", "processes"):
            _check(getattr(self, key) > 0, f"tools.sandbox.{key}", "must be > 0")
        _check(self.memory_mb >= 64, "tools.sandbox.memory_mb", "must be >= 64 (the interpreter needs about 20)")
        _check(self.open_files >= 16, "tools.sandbox.open_files", "must be >= 16 (the interpreter needs a few)")
        _check(self.max_output_chars >= 200, "tools.sandbox.max_output_chars", "must be >= 200 (room for markers)")
        for name in self.packages:
            spec = importlib.util.find_spec(name) if name.isidentifier() else None
            _check(
                spec is not None and spec.has_location,
                "tools.sandbox.packages",
                f"{name!r} is not an installed top-level package or module (numpy, not numpy.linalg)",
            )


@dataclass
class ToolsConfig:
    names: List[str] = field(default_factory=lambda: list(MINIMIND_TOOL_NAMES))
    timeout_s: float = 2.0  # per call
    max_output_chars: int = 2048  # observation cap; longer output is cut with a marker
    # calls running at once, those of every trajectory of a turn together (the rest wait for a free slot; a call's
    # timeout counts from its own start); as many as the code sandbox's workers
    max_concurrent_calls: int = 4
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # code_interpreter only

    def __post_init__(self) -> None:
        _check(len(self.names) > 0, "tools.names", "must name at least one tool")
        _check(self.timeout_s > 0, "tools.timeout_s", "must be > 0")
        _check(self.max_concurrent_calls > 0, "tools.max_concurrent_calls", "must be > 0")
        _check(self.max_output_chars > 0, "tools.max_output_chars", "must be > 0")


class RewardModelTrajectories(str, Enum):
    """Which trajectories the reward model scores; the others get 0."""

    no_tool = "no_tool"  # MiniMind: those that answered without calling a tool
    all = "all"  # every one, its tool calls and results in the conversation the reward model reads


@dataclass
class RewardModelConfig:
    """A learned reward model whose clipped score is the reward term `rm` (minirl/training/reward_model.py)."""

    # a Hugging Face AutoModelForSequenceClassification with one output (num_labels=1): a hub id or a directory
    # written by save_pretrained; null = off (the term `rm` is 0). MiniMind used one; none ships with minirl
    name_or_path: Optional[str] = None
    trajectories: RewardModelTrajectories = RewardModelTrajectories.no_tool  # no_tool | all
    clip: float = 3.0  # the score is clipped to [-clip, clip] before it is weighted (MiniMind: 3)
    batch_size: int = 16  # conversations per forward pass
    max_tokens: int = 2048  # a longer conversation loses its beginning: the reward model reads the last max_tokens
    device: str = "auto"  # auto (trainer.device's) | cpu | mps | cuda | cuda:N
    dtype: DType = DType.float32

    def __post_init__(self) -> None:
        _check(self.clip > 0, "reward.model.clip", f"must be > 0, got {self.clip}")
        _check(self.batch_size > 0, "reward.model.batch_size", f"must be > 0, got {self.batch_size}")
        _check(self.max_tokens > 0, "reward.model.max_tokens", f"must be > 0, got {self.max_tokens}")
        _check(
            re.fullmatch(DEVICE_NAMES, self.device) is not None,
            "reward.model.device",
            f"must be auto, cpu, mps, cuda or cuda:N, got {self.device!r}",
        )


@dataclass
class RewardConfig:
    # weight of each registered reward term; every term is logged, weight 0 included
    weights: Dict[str, float] = field(default_factory=dict)
    clip: float = 3.0  # the weighted sum is clipped to [-clip, clip]
    # registry key: gt_in_answer | boxed_answer; when a trajectory counts as solved (success-rate metrics)
    success: str = "gt_in_answer"
    model: RewardModelConfig = field(default_factory=RewardModelConfig)  # the term `rm`'s reward model
    # the most a term's UNWEIGHTED value counts, either way, before its weight: term name -> cap; a term not named
    # is not capped (MiniMind caps its repetition penalty at 0.5: reward=minimind sets repetition: 0.5)
    caps: Dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.clip > 0, "reward.clip", "must be > 0")
        for name, cap in self.caps.items():
            _check(cap > 0, f"reward.caps.{name}", f"must be > 0, got {cap}")


@dataclass
class ProtocolConfig:
    """How tool calls are written and read (minirl/protocol). `format` must match the model's chat
    template: the embedded tiny model and Qwen2.5 write Hermes JSON, Qwen3-Coder writes XML."""

    format: str = "hermes"  # registry key: hermes | qwen3_coder | llama3_json | deepseek_v3 | harmony
    call_policy: CallPolicy = CallPolicy.multi  # multi (MiniMind) | strict_single (ReTool) | lenient (MiniMind's parse)
    max_calls_per_turn: int = 4  # more calls in one turn make the turn invalid; 1 under strict_single
    max_tool_output_tokens: int = 512  # a longer observation keeps this many tokens, with a marker where it is cut
    observation_cut: ObservationCut = ObservationCut.head_tail  # head_tail | tail (ReTool) | head: which tokens stay
    # the next prompt leaves at least this many tokens of rollout.max_total_tokens to sample: if it would not, the
    # turn's observations are cut to one lower token cap, the largest that leaves them; if even their markers alone
    # leave fewer, the trajectory ends (TOKEN_BUDGET); a turn samples at most rollout.max_new_tokens, so no more
    # room than that is asked for
    min_sample_room: int = 16

    def __post_init__(self) -> None:
        _check(self.max_calls_per_turn > 0, "protocol.max_calls_per_turn", "must be > 0")
        _check(
            self.call_policy is not CallPolicy.strict_single or self.max_calls_per_turn == 1,
            "protocol.max_calls_per_turn",
            f"must be 1 under call_policy=strict_single (one call per turn), got {self.max_calls_per_turn}",
        )
        _check(self.max_tool_output_tokens > 0, "protocol.max_tool_output_tokens", "must be > 0")
        _check(self.min_sample_room > 0, "protocol.min_sample_room", f"must be > 0, got {self.min_sample_room}")


@dataclass
class RolloutConfig:
    engine: str = "torch"  # registry key: torch | hf | vllm
    group_size: int = 8  # trajectories sampled per prompt (G)
    max_turns: int = 3  # assistant turns per trajectory
    max_new_tokens: int = 96  # per assistant turn
    max_total_tokens: int = 1024  # prompt + whole conversation
    max_tool_calls: int = 8  # per trajectory; calls past it are not run (an "over_budget" observation)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    gpu_memory_utilization: float = 0.4  # vllm only: share of GPU memory (on CPU: of RAM) vLLM may take
    max_model_len: int = 0  # vllm only: its context length; 0 = max_total_tokens + max_new_tokens (at most the model's)
    sleep_while_training: bool = True  # vllm on CUDA: sleep (KV cache freed) from each rollout to the weight sync
    # every this many steps, check that the engine samples from the updated weights (minirl/training/sync_check.py):
    # one sequence scored by the engine and by the trainer before and after the update; 0 = off
    sync_check_every: int = 10
    # MiniMind's open_thinking: the share of training trajectories rendered with the chat template's thinking on
    # (enable_thinking=true; the rest false), drawn per thinking_unit from the run's RNG; null = no draw, the
    # template kwargs as model.chat_template_kwargs set them (held-out evaluation always renders so)
    thinking_ratio: Optional[float] = None
    thinking_unit: ThinkingUnit = ThinkingUnit.group  # group | trajectory
    # true: every live trajectory's turn is sampled in one engine call, then all their tool calls run, then the
    # next turn (the same seed repeats bit for bit); false (the torch engine): a trajectory's calls start as its
    # turn ends and its next turn joins the decoding batch when they are in, each trajectory drawing from a
    # generator of its own (minirl/rollout/agent_loop.py); engines without that schedule ignore it
    barrier: bool = True

    def __post_init__(self) -> None:
        _check(self.group_size >= 1, "rollout.group_size", "must be >= 1")
        _check(self.max_turns >= 1, "rollout.max_turns", f"must be >= 1, got {self.max_turns}")
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
        _check(self.max_tool_calls >= 1, "rollout.max_tool_calls", "must be >= 1")
        _check(self.max_total_tokens > self.max_new_tokens, "rollout.max_total_tokens", "must exceed max_new_tokens")
        _check(
            self.temperature >= GREEDY_BELOW,
            "rollout.temperature",
            f"must be >= {GREEDY_BELOW} (sampling is required for RL; lower decodes greedily)",
        )
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        _check(self.top_k >= 0, "rollout.top_k", "must be >= 0")
        _check(self.sync_check_every >= 0, "rollout.sync_check_every", "must be >= 0 (0 = off)")
        ratio = self.thinking_ratio
        _check(ratio is None or 0 <= ratio <= 1, "rollout.thinking_ratio", f"must be in [0, 1] or null, got {ratio}")
        _check(0 < self.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization", "must be in (0, 1]")
        _check(
            self.max_model_len == 0 or self.max_model_len >= self.max_total_tokens,
            "rollout.max_model_len",
            f"must be 0 (derived) or at least rollout.max_total_tokens ({self.max_total_tokens}), which a "
            f"conversation may fill, got {self.max_model_len}",
        )


@dataclass
class LossConfig:
    """The policy loss (minirl/algos/losses.py); docs/algorithms.md maps each key to verl and TRL."""

    name: str = "grpo"  # registry key: grpo | cispo | gspo
    # bounds 1 - clip_low and 1 + clip_high of the ratio (grpo: per token, gspo: per sequence) or of the
    # IS weight (cispo); clip_low >= 1 means no lower bound
    clip_low: float = 0.2
    clip_high: float = 0.2
    # dual-clip PPO (arXiv 1912.09729), grpo only: a token with A < 0 loses at most -A * clip_ratio_c, however
    # far its ratio rises above clip_ratio_c (verl's vanilla loss, the same default); 0 = off, else > 1
    clip_ratio_c: float = 3.0
    beta: float = 0.02  # KL-in-loss coefficient; 0 with algo.kl_in_reward off = no reference model
    kl_estimator: str = "k3"  # registry key: k1 | k2 | k3
    agg: str = "seq-mean-token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    # the constant divisor of seq-mean-token-sum-norm (Dr. GRPO); 0 = rollout.max_turns * rollout.max_new_tokens,
    # the most tokens one trajectory can sample (set by Config)
    max_tokens_norm: int = 0
    # weight of a supervised term: the negative log-likelihood of each replayed reference answer's action tokens
    # (algo.guide), aggregated as agg over the whole batch, so a reference row weighs as one more unit of
    # advantage would at ratio 1, without the clip (SRFT, ReLIFT); 0 = the references learn by their advantage only
    reference_nll: float = 0.0

    def __post_init__(self) -> None:
        _check(self.clip_low >= 0, "loss.clip_low", f"must be >= 0, got {self.clip_low}")
        _check(self.clip_high >= 0, "loss.clip_high", f"must be >= 0, got {self.clip_high}")
        _check(
            self.clip_ratio_c == 0 or self.clip_ratio_c > 1,
            "loss.clip_ratio_c",
            f"must be 0 (off) or > 1, got {self.clip_ratio_c}",
        )
        _check(self.beta >= 0, "loss.beta", f"must be >= 0, got {self.beta}")
        _check(self.max_tokens_norm >= 0, "loss.max_tokens_norm", f"must be >= 0, got {self.max_tokens_norm}")
        _check(self.reference_nll >= 0, "loss.reference_nll", f"must be >= 0, got {self.reference_nll}")


class OldLogprobs(str, Enum):
    sampler = "sampler"
    recompute = "recompute"


class RolloutIS(str, Enum):
    off = "off"
    token = "token"
    sequence = "sequence"


class Overlong(str, Enum):
    off = "off"
    mask = "mask"
    penalty = "penalty"


@dataclass
class AlgoConfig:
    adv_estimator: str = "grpo"  # registry key: grpo | dr_grpo | rloo | reinforce_plus_plus
    adv_eps: float = 1e-4  # added to the std the advantages divide by (grpo: group, reinforce_plus_plus: batch)
    # fold the KL to the frozen reference into the reward before advantages: r - kl_coef * (per-trajectory KL)
    kl_in_reward: bool = False
    kl_coef: float = 1e-3
    kl_estimator: str = "k1"  # registry key: k1 | k2 | k3; summed over the trajectory's sampled tokens
    # log pi_old, the denominator of the loss's ratio: sampler = the log-probs the rollout engine reported;
    # recompute = the trainer's own forward pass with the current weights, once per batch before the first update
    old_logprobs: OldLogprobs = OldLogprobs.sampler
    # sampler/trainer mismatch correction (minirl/algos/rollout_correction.py); needs old_logprobs=recompute:
    # off | token (loss weights min(pi_old / pi_sampler, C)) | sequence (no loss for trajectories whose
    # ratio prod_t pi_old / pi_sampler lies outside [1/C, C])
    rollout_is: RolloutIS = RolloutIS.off
    rollout_is_threshold: float = 2.0  # C
    # DAPO dynamic sampling (minirl/algos/dapo.py): drop groups whose rewards all tie; then roll out up to
    # max_resample_rounds more rounds until trainer.prompts_per_step groups are kept, and drop the surplus
    dynamic_sampling: bool = True
    max_resample_rounds: int = 0
    # off-policy guidance (LUFFY): in a group whose rewards all tie below what its task's reference answer earns,
    # the last sample is replaced by that reference, played through the agent loop; a task without a reference,
    # or whose reference does not replay as written (a limit, a rejected call), and groups of one are left as is
    guide: bool = True
    # guidance also in a group whose rewards differ, where at most this share of it earns what the reference does
    # (its last sample replaced where it earns less); 0: only groups whose rewards all tie. Above 0 every group's
    # reference is replayed each round
    guide_solved_share: float = 0.0
    prompts_per_round: int = 0  # prompts each round rolls out (verl's gen_batch_size); 0 = trainer.prompts_per_step
    # trajectories cut by rollout.max_new_tokens or rollout.max_total_tokens: off | mask (no loss) | penalty
    # (DAPO's soft overlong punishment: from overlong_buffer tokens before the nearer limit down to -overlong_penalty)
    overlong: Overlong = Overlong.off
    overlong_buffer: int = 16
    overlong_penalty: float = 1.0
    # trainer.async_rollout: trajectories sampled more than this many policy versions before the weights that
    # train on them are dropped (minirl/training/pipeline.py); one step off samples at a staleness of exactly 1
    max_staleness: int = 1

    def __post_init__(self) -> None:
        _check(self.adv_eps >= 0, "algo.adv_eps", "must be >= 0")
        _check(self.max_staleness >= 0, "algo.max_staleness", f"must be >= 0, got {self.max_staleness}")
        _check(self.kl_coef >= 0, "algo.kl_coef", f"must be >= 0, got {self.kl_coef}")
        _check(
            0 <= self.guide_solved_share < 1,
            "algo.guide_solved_share",
            f"must be in [0, 1), got {self.guide_solved_share}",
        )
        _check(
            self.rollout_is is RolloutIS.off or self.old_logprobs is OldLogprobs.recompute,
            "algo.rollout_is",
            f"{self.rollout_is.value} needs the trainer's old log-probs: set algo.old_logprobs=recompute",
        )
        threshold = self.rollout_is_threshold
        _check(threshold >= 1, "algo.rollout_is_threshold", f"must be >= 1, got {threshold}")
        _check(self.max_resample_rounds >= 0, "algo.max_resample_rounds", "must be >= 0")
        _check(self.prompts_per_round >= 0, "algo.prompts_per_round", f"must be >= 0, got {self.prompts_per_round}")
        _check(
            self.dynamic_sampling or self.prompts_per_round == 0,
            "algo.prompts_per_round",
            "rounds larger than the batch need a filter: set algo.dynamic_sampling=true or leave it at 0",
        )
        _check(
            self.dynamic_sampling or self.max_resample_rounds == 0,
            "algo.max_resample_rounds",
            "resampling refills dynamic sampling's batch: set algo.dynamic_sampling=true or leave it at 0",
        )
        _check(self.overlong_buffer > 0, "algo.overlong_buffer", f"must be > 0, got {self.overlong_buffer}")
        _check(self.overlong_penalty >= 0, "algo.overlong_penalty", f"must be >= 0, got {self.overlong_penalty}")


# functional form: "raise" is a Python keyword, and omegaconf reads enum values by member name
OnError = Enum("OnError", {"raise": "raise", "skip": "skip"}, type=str)


@dataclass
class DataConfig:
    name: str = "synthetic_tools"  # registry key: synthetic_tools | synthetic_math | jsonl
    path: Optional[str] = None  # jsonl: training tasks
    heldout_path: Optional[str] = None  # jsonl: held-out tasks (default: the file's last heldout_size rows)
    train_size: int = 2000
    heldout_size: int = 64
    seed: int = 0
    # synthetic datasets: wordings of the RL and held-out questions; the warm start only ever sees
    # the "core" ones, so "unseen" makes RL generalise to new wordings (all | unseen | core)
    phrasings: PhrasingSet = PhrasingSet.all
    # the RL training questions' wordings alone (null: data.phrasings); the held-out set keeps data.phrasings
    train_phrasings: Optional[PhrasingSet] = None
    on_error: OnError = OnError["raise"]  # a malformed jsonl row: raise (naming file:line) | skip (counted, logged)
    max_row_bytes: int = 1_000_000  # a longer jsonl line is malformed

    def __post_init__(self) -> None:
        _check(self.max_row_bytes > 0, "data.max_row_bytes", "must be > 0")
        _check(self.train_size > 0, "data.train_size", "must be > 0")
        _check(self.heldout_size > 0, "data.heldout_size", "must be > 0")
        known = [p.value for p in PhrasingSet]
        _check(self.phrasings in known, "data.phrasings", f"must be one of {', '.join(known)}")
        _check(
            self.train_phrasings is None or self.train_phrasings in known,
            "data.train_phrasings",
            f"must be null or one of {', '.join(known)}",
        )


class Resume(str, Enum):
    never = "never"
    auto = "auto"


class LRSchedule(str, Enum):
    constant = "constant"
    cosine = "cosine"


@dataclass
class TrainerConfig:
    steps: int = 50
    prompts_per_step: int = 14  # tasks per step, group_size samples each; dynamic sampling drops the groups that tie
    lr: float = 3e-4
    lr_schedule: LRSchedule = LRSchedule.cosine
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1  # passes over each rollout batch; >1 reuses samples and makes clipping bite
    # optimizer steps per pass: the batch is shuffled (trainer.seed) and split into this many mini-batches
    mini_batches: int = 1
    micro_batch_size: int = 8  # trajectories per forward/backward; gradients add up to the mini-batch's
    eval_every: int = 10  # held-out evaluation every N steps (and at step 0 and the end)
    eval_temperature: float = 0.0  # 0 = greedy
    save_final: bool = True
    # one step off (minirl/training/pipeline.py): the rollout of step t+1 runs on a worker thread, from the weights
    # before step t's update, while step t trains; needs algo.old_logprobs=recompute (experiment=async sets it)
    async_rollout: bool = False
    # checkpoints (minirl/training/checkpoint.py): every save_every steps (0 = never) into <run dir>/checkpoints,
    # keeping the newest keep_last; resume: never | auto (continue from the run directory's newest one)
    save_every: int = 0
    keep_last: int = 2
    resume: Resume = Resume.never
    max_bad_steps: int = 3  # non-finite loss or gradient: the update is skipped; this many steps in a row stop the run
    nan_loss_steps: List[int] = field(default_factory=list)  # fault drill: these steps' losses are made NaN
    trajectories_every: int = 10  # write sampled trajectories to <run dir>/trajectories.jsonl (0 = never)
    seed: int = 0
    # the same seed and thread count give the same run, bit for bit (torch.use_deterministic_algorithms);
    # false lets a few kernels (e.g. accumulating index writes) run in parallel in a varying order
    deterministic: bool = True
    device: str = "auto"  # auto | cpu | mps | cuda | cuda:N
    # torch threads of this process (0: torch's own choice, one per core); a parallel sweep gives each job its
    # share of the cores (minirl/sweep.py). Part of what makes a run repeat: the same seed and thread count
    threads: int = 0
    # the update's forwards and backwards under bfloat16 autocast; the weights, their gradients and Adam's state
    # stay in model.dtype (CUDA, or a CPU with bf16 kernels: without them the run warns at start-up)
    bf16_autocast: bool = False
    # how the policy spreads over the processes of `torchrun --nproc_per_node N -m minirl.train` (minirl/distributed/):
    # none (one process) | ddp (a replica per rank, gradients averaged) | fsdp2 (sharded; experimental)
    strategy: str = "none"

    def __post_init__(self) -> None:
        for key in ("steps", "prompts_per_step", "ppo_epochs", "mini_batches", "micro_batch_size", "eval_every"):
            _check(getattr(self, key) > 0, f"trainer.{key}", "must be > 0")
        _check(self.lr > 0, "trainer.lr", "must be > 0")
        _check(self.max_grad_norm > 0, "trainer.max_grad_norm", "must be > 0")
        _check(self.eval_temperature >= 0, "trainer.eval_temperature", "must be >= 0")
        for key in ("save_every", "trajectories_every", "warmup_steps", "weight_decay", "threads"):
            _check(getattr(self, key) >= 0, f"trainer.{key}", "must be >= 0")
        _check(self.keep_last >= 1, "trainer.keep_last", "must be >= 1")
        _check(self.max_bad_steps >= 1, "trainer.max_bad_steps", "must be >= 1")
        _check(
            re.fullmatch(DEVICE_NAMES, self.device) is not None,
            "trainer.device",
            f"must be auto, cpu, mps, cuda or cuda:N, got {self.device!r}",
        )


class WandbMode(str, Enum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # registry key: wandb | none (metrics.jsonl and the console are always on)
    project: str = "minirl"
    mode: WandbMode = WandbMode.offline  # `logger.mode=online` streams to W&B
    run_name: Optional[str] = None  # null: in a sweep, the job's swept overrides (loss=cispo trainer.seed=1)
    group: Optional[str] = None  # W&B's group; null: in a sweep, its hydra.sweep.dir, so the UI groups its runs


@dataclass
class SweepConfig:
    """What a job of a multirun (`python -m minirl.train -m ...`) gives its sweeper, and what a rerun into the
    same hydra.sweep.dir does (minirl/sweep.py)."""

    # the metric a job returns to the sweeper (Optuna's objective): the mean of its last objective_window values
    # in metrics.jsonl (eval/success_rate: the final held-out success rate)
    objective: str = "eval/success_rate"
    objective_window: int = 1
    # a rerun into the same hydra.sweep.dir: a job that finished is skipped (its objective read back), one that
    # was interrupted or failed runs again from its newest checkpoint (trainer.save_every), else from step 0
    skip_finished: bool = True

    def __post_init__(self) -> None:
        _check(self.objective_window >= 1, "sweep.objective_window", "must be >= 1")


@dataclass
class ServeConfig:
    """`python -m minirl.serve`: an OpenAI-compatible HTTP server for `model` (minirl/serving)."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0 = any free port (the chosen one is printed)
    model_id: Optional[str] = None  # the name /v1/models lists and requests must use; default model.name_or_path
    max_batch_size: int = 16  # requests (times their n) decoded together in one batch
    max_queue: int = 256  # requests waiting for a batch; further ones get HTTP 429
    max_tokens: int = 256  # per completion, when a request does not say
    # clients must send `Authorization: Bearer <key>` (all but GET /health); null = $MINIRL_API_KEY, which keeps
    # the key out of config dumps and Hydra's .hydra/ files; neither = no key. Left out of the repr.
    api_key: Optional[str] = field(default=None, repr=False)
    # without a key, a serve.host other than loopback (0.0.0.0, ::, an address or name other machines reach) is
    # refused at start-up unless this is true
    allow_unauthenticated: bool = False

    def __post_init__(self) -> None:
        _check(0 <= self.port < 65536, "serve.port", f"must be in [0, 65535], got {self.port}")
        for key in ("max_batch_size", "max_queue", "max_tokens"):
            _check(getattr(self, key) > 0, f"serve.{key}", "must be > 0")


@dataclass
class EvalConfig:
    """`python -m minirl.eval`: the held-out tasks through the training agent loop (minirl/evaluation)."""

    backend: str = "local"  # registry key: local (model.name_or_path in-process) | openai (any compatible endpoint)
    base_url: Optional[str] = None  # openai: e.g. http://127.0.0.1:8000/v1
    api_key: str = "EMPTY"  # openai: sent as the bearer token
    model_id: Optional[str] = None  # openai: the model to request; default the endpoint's first /v1/models entry
    samples: int = 1  # N trajectories per task: avg@N and pass@N
    temperature: float = 0.0  # 0 = greedy (then samples > 1 repeat the same answer)
    seed: int = 0
    concurrency: int = 8  # openai: conversations in flight at once
    max_tasks: Optional[int] = None  # the first N held-out tasks; default all
    output: str = "eval.json"  # relative paths land in the run directory

    def __post_init__(self) -> None:
        _check(self.samples >= 1, "eval.samples", f"must be >= 1, got {self.samples}")
        _check(self.temperature >= 0, "eval.temperature", "must be >= 0")
        _check(self.concurrency >= 1, "eval.concurrency", "must be >= 1")
        _check(self.max_tasks is None or self.max_tasks >= 1, "eval.max_tasks", "must be >= 1")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    # Python modules imported at start-up, before any registry name resolves (minirl/validate.py), so that
    # their @tool functions, reward terms, losses, advantage estimators and datasets register
    imports: List[str] = field(default_factory=list)
    output_dir: str = "."  # set by the entry point to the Hydra run directory
    overrides: List[str] = field(default_factory=list)  # set by the entry point: the job's command-line overrides

    def __post_init__(self) -> None:
        if self.loss.max_tokens_norm == 0:  # a default that depends on another section
            self.loss.max_tokens_norm = self.rollout.max_turns * self.rollout.max_new_tokens
        batch = self.trainer.prompts_per_step * self.rollout.group_size
        _check(self.trainer.mini_batches <= batch, "trainer.mini_batches", f"must be <= {batch}, the batch's size")
        _check(
            self.algo.overlong is not Overlong.penalty or self.algo.overlong_buffer < self.rollout.max_new_tokens,
            "algo.overlong_buffer",
            f"must be < rollout.max_new_tokens ({self.rollout.max_new_tokens}), or every trajectory is penalised",
        )
        if self.trainer.async_rollout:
            self._check_async()

    def _check_async(self) -> None:
        """What one step off needs of the other sections (minirl/training/pipeline.py)."""
        _check(
            self.algo.old_logprobs is OldLogprobs.recompute,
            "trainer.async_rollout",
            "a step-old sampler's log-probs are not pi_old: set algo.old_logprobs=recompute (and algo.rollout_is "
            "to correct the gap), or use experiment=async, which sets both",
        )
        _check(
            self.algo.max_staleness >= 1,
            "algo.max_staleness",
            "must be >= 1 under trainer.async_rollout: one step off trains on trajectories one version old",
        )
        _check(
            self.model.lora.dropout == 0,
            "trainer.async_rollout",
            "the rollout draws from the global torch RNG on its worker thread while the update runs, and "
            "model.lora.dropout > 0 would draw from it too, so a seeded run would not repeat: set model.lora.dropout=0",
        )


def register_configs() -> None:
    ConfigStore.instance().store(name="minirl_schema", node=Config)


def _reject_unknown_keys(node: DictConfig, path: str = "") -> None:
    """`+key=value` can add a key to a structured node; the schema has no place for it."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return
    known = {f.name for f in dataclasses.fields(schema)}
    for key in node:
        full = f"{path}{key}"
        if key not in known:
            raise ConfigError(f"{full}: not a key of {schema.__name__}; known: {', '.join(sorted(known))}")
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _reject_unknown_keys(child, full + ".")


def _reject_non_finite(value: Any, path: str = "") -> None:
    """No option takes inf or nan (`trainer.lr=inf` would train on NaN weights until it crashed); `value` is
    the config as plain containers."""
    if isinstance(value, dict):
        for key, item in value.items():
            _reject_non_finite(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _reject_non_finite(item, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number, got {value}")


def to_config(cfg: DictConfig) -> Config:
    """Convert the composed config once; range checks run here. Raises ConfigError."""
    _reject_unknown_keys(cfg)
    _reject_non_finite(OmegaConf.to_container(cfg, resolve=False))
    try:
        return OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as err:  # omegaconf validation errors carry the key
        raise ConfigError(str(err).splitlines()[0]) from err
