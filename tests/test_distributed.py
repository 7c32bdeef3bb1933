"""Training over several processes (minirl/distributed/), for real: `torchrun` with the gloo backend on CPU, 2
processes. The gradients before the optimizer step and the weights after an SGD step equal one process's on the
same global batch in every loss.agg mode, under ddp and fsdp2, with gradient checkpointing and with LoRA; the
same comparison fails when the gradients are summed instead of averaged or never reduced (a forward that skips
the wrapper). A 2-process training run logs each step once and resumes after `kill -9` of one rank, as if never
stopped, synchronous and one step off (each rank's rollout worker gathers its rounds in a process group of its
own while the update reduces gradients); fsdp2 rolls out rows of unequal lengths on its ranks without a deadlock
and resumes from its checkpoint, both ways; a failure on one rank stops the run and names the rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minirl.algos.losses import AGGREGATIONS
from minirl.distributed.strategies import STRATEGIES, Parallel
from minirl.distributed.world import World
from minirl.errors import ConfigError
from minirl.training.checkpoint import rank_rng_state
from minirl.training.groups import gathered

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
RUN = ("debug=cpu", "logger=none", "trainer.eval_every=100", "trainer.trajectories_every=0")


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*TORCHRUN, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """This module's own model cache: torchrun gives each rank one thread, and a tiny model built with one thread
    differs in its last bits from the session cache's (built with the machine's thread count), which other tests
    compare against tolerances."""
    return tmp_path_factory.mktemp("torchrun-model-cache")


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def gradient_runs(request, tmp_path_factory) -> tuple[str, Path]:
    """(strategy, folder) of tests/distributed_worker.py's results under that strategy."""
    out = tmp_path_factory.mktemp(f"grads-{request.param}")
    done = torchrun("tests/distributed_worker.py", request.param, str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, out


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
def test_gradients_and_an_sgd_step_equal_one_process_in_every_agg_mode(gradient_runs, agg):
    strategy, out = gradient_runs
    result = torch.load(out / f"{agg}.pt", weights_only=False)
    single, spread = result["single"], result["spread"]
    scale = max(float(g.abs().max()) for g in single["grads"].values())
    assert scale > 1e-3  # a gradient worth comparing
    assert max_diff(spread["grads"], single["grads"]) < 1e-6, strategy
    assert max_diff(spread["weights"], single["weights"]) < 1e-6
    assert spread["metrics"].keys() == single["metrics"].keys()
    for key, value in single["metrics"].items():  # the loss, its parts and the entropy of the whole mini-batch
        assert spread["metrics"][key] == pytest.approx(value, abs=1e-6), key
    # summed over the 2 ranks instead of averaged: twice the gradient, which the comparison above catches
    doubled = {k: 2 * g for k, g in single["grads"].items()}
    assert max_diff(result["summed"], doubled) < 1e-5
    assert max_diff(result["summed"], single["grads"]) > scale / 2
    if strategy == "ddp":  # never reduced: each rank keeps its own part, the comparison fails on both
        ranks = result["unreduced"]
        assert all(max_diff(part, single["grads"]) > 1e-3 for part in ranks)
        mean = {k: (ranks[0][k] + ranks[1][k]) / 2 for k in ranks[0]}
        assert max_diff(mean, single["grads"]) < 1e-6  # what averaging them would have given


@pytest.mark.parametrize("variant", ["checkpointed", "lora"])
def test_gradient_checkpointing_and_lora_give_one_process_gradients(gradient_runs, variant):
    strategy, out = gradient_runs
    result = torch.load(out / f"{variant}.pt", weights_only=False)
    single, spread = result["single"], result["spread"]
    if variant == "lora":  # only the adapters have gradients
        assert single["grads"] and all("lora_" in name for name in single["grads"])
    assert max_diff(spread["grads"], single["grads"]) < 1e-6, strategy
    assert max_diff(spread["weights"], single["weights"]) < 1e-6


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's rows of training steps (held-out evaluations left out)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "reward/mean" in row]


def rank_pids(launcher: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of the processes torchrun started, read from their environments."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(v.split("=", 1) for v in (entry / "environ").read_text().split("\0") if "=" in v)
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if "RANK" in env and parent == launcher.pid:
            found[int(env["RANK"])] = int(entry.name)
    return found


@pytest.mark.parametrize("one_step_off", [False, True], ids=["synchronous", "one-step-off"])
def test_a_ddp_run_logs_each_step_once_and_resumes_after_kill_9_of_a_rank(cache_dir, tmp_path, one_step_off):
    steps = ("trainer.steps=12", "trainer.save_every=1", "trainer.strategy=ddp", f"model.cache_dir={cache_dir}")
    # one step off, each rank's worker gathers the next round while the update's backward reduces gradients
    steps = (*steps, "experiment=async") if one_step_off else steps
    whole = tmp_path / "whole"
    done = torchrun("-m", "minirl.train", *RUN, *steps, f"hydra.run.dir={whole}")
    assert done.returncode == 0, done.stderr[-3000:]
    expected = metric_rows(whole)
    assert [row["step"] for row in expected] == list(range(1, 13))  # each step once: rank 0 alone logs
    if one_step_off:  # every step after the first trained on the rollout sampled during its predecessor's update
        assert [row["async/staleness_max"] for row in expected] == [0.0] + [1.0] * 11
    assert done.stdout.count("step    3/12") == 1
    assert json.loads((whole / "job.json").read_text())["attempts"] == 1

    killed = tmp_path / "killed"
    args = [*TORCHRUN, "-m", "minirl.train", *RUN, *steps, f"hydra.run.dir={killed}"]
    launcher = subprocess.Popen(args, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (killed / "checkpoints" / "step_000002").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, "the run ended before its second checkpoint"
        time.sleep(0.02)
    os.kill(rank_pids(launcher)[1], signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    assert "rank      : 1" in stderr  # torchrun names the rank that died and stops the other
    assert len(metric_rows(killed)) < 12

    resumed = torchrun("-m", "minirl.train", *RUN, *steps, "trainer.resume=auto", f"hydra.run.dir={killed}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    rows = metric_rows(killed)
    assert [row["step"] for row in rows] == list(range(1, 13))
    # both ranks' weights, optimizer, RNG streams and data position resumed; one step off, the rollout sampled
    # for the step after the checkpoint too
    for row, want in zip(rows, expected):
        for key in ("reward/mean", "rollout/sampled_tokens", "loss/policy", "grad_norm"):
            assert row.get(key) == pytest.approx(want.get(key), abs=1e-6), (row["step"], key)


@pytest.mark.parametrize("one_step_off", [False, True], ids=["synchronous", "one-step-off"])
def test_fsdp2_rolls_out_unequal_lengths_on_its_ranks_and_resumes_from_its_checkpoint(
    cache_dir, tmp_path, one_step_off
):
    run_dir = tmp_path / "fsdp2"
    common = (*RUN, "trainer.strategy=fsdp2", "trainer.save_every=1", "rollout.max_new_tokens=64")
    common = (*common, f"model.cache_dir={cache_dir}", *(["experiment=async"] if one_step_off else []))
    done = torchrun("-m", "minirl.train", *common, "trainer.steps=3", "trainer.trajectories_every=1",
                    f"hydra.run.dir={run_dir}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    unequal = 0
    for step in (1, 2, 3):  # rank 0 rolled out the first group of each step, rank 1 the second
        groups = {}
        for record in (r for r in records if r["step"] == step and not r["off_policy"]):  # what the ranks sampled
            groups.setdefault(record["group"], []).append(record["tokens"]["response"])
        assert sorted(groups) == [0, 1]
        unequal += max(groups[0]) != max(groups[1])  # the ranks' decoding loops ran different numbers of steps
    assert unequal > 0
    resumed = torchrun("-m", "minirl.train", *common, "trainer.steps=4", "trainer.resume=auto",
                       f"hydra.run.dir={run_dir}")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 3)" in resumed.stdout
    assert [row["step"] for row in metric_rows(run_dir)] == [1, 2, 3, 4]


def test_a_failure_on_one_rank_stops_the_run_and_names_the_rank(cache_dir, tmp_path):
    (tmp_path / "rank_one_fails.py").write_text(
        "import os\n"
        "from minirl.rewards.terms import REWARD_TERMS\n\n\n"
        "@REWARD_TERMS.register('fails_on_rank_1')\n"
        "def fails_on_rank_1(traj):\n"
        "    if os.environ.get('RANK') == '1':\n"
        "        raise RuntimeError('the reward server is down')\n"
        "    return 0.0\n"
    )
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    failing = ("imports=[rank_one_fails]", "+reward.weights.fails_on_rank_1=1.0", f"hydra.run.dir={tmp_path / 'run'}")
    args = [*TORCHRUN, "-m", "minirl.train", *RUN, "trainer.strategy=ddp", f"model.cache_dir={cache_dir}", *failing]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "minirl: rank 1 of 2 failed: RuntimeError: the reward server is down" in done.stderr


# -- a world of one, and the pieces every rank runs alike ------------------------------------------------------


@pytest.mark.fast
def test_a_world_of_one_has_identity_collectives_and_its_shares_keep_whole_groups_in_order():
    world = World()
    assert world.is_main and world.gather("x") == ["x"] and world.broadcast(3) == 3
    t = torch.arange(4.0)
    assert world.sum_(t) is t and torch.equal(t, torch.arange(4.0))
    tasks = list(range(7))  # a round's tasks; each task is a group
    parts = [World(rank=r, size=3).share(tasks) for r in range(3)]
    assert parts == [[0, 1], [2, 3], [4, 5, 6]] and sum(parts, []) == tasks  # contiguous, rank order
    assert [World(rank=r, size=8).share(tasks) for r in range(8)].count([]) == 1  # more ranks than tasks


@pytest.mark.fast
def test_gathered_groups_are_numbered_by_their_place_in_the_whole_round():
    class Fake:  # the one field gathered reads and writes
        def __init__(self, group_index: int) -> None:
            self.group_index = group_index

    class TwoRanks(World):  # what all_gather_object hands every rank: rank 0's round, then rank 1's
        def gather(self, obj):
            return [[Fake(0), Fake(0), Fake(1), Fake(1)], obj]

    mine = [Fake(0), Fake(0), Fake(1), Fake(1), Fake(2), Fake(2)]  # rank 1's three groups of two
    round_ = gathered(TwoRanks(rank=1, size=2), mine)
    assert [t.group_index for t in round_] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.fast
def test_strategy_none_under_several_processes_and_a_resume_with_another_count_are_config_errors():
    assert STRATEGIES.names() == ["ddp", "fsdp2", "none"]
    with pytest.raises(ConfigError, match="trainer.strategy=none under 2 processes"):
        Parallel(torch.nn.Linear(2, 2), World(rank=0, size=2))
    states = [{"torch": 0}, {"torch": 1}]
    assert rank_rng_state(states, 1, 2) == {"torch": 1}
    assert rank_rng_state({"torch": 0}, 0, 1) == {"torch": 0}  # a checkpoint of one process (or an older one)
    with pytest.raises(ConfigError, match="written by 2 processes, this run has 1"):
        rank_rng_state(states, 0, 1)
