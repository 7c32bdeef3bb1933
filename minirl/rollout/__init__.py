"""Rollout engines and the multi-turn agent loop; importing registers the `hf`, `torch` and `vllm` engines."""

from minirl.rollout import hf_engine, torch_engine, vllm_engine
from minirl.rollout.engine import ENGINES, Completion, Engine, SamplingParams

__all__ = ["ENGINES", "Completion", "Engine", "SamplingParams", "hf_engine", "torch_engine", "vllm_engine"]
