"""Several processes, one run: the process group (world.py) and how the policy is spread over it
(strategies.py: none | ddp | fsdp2, `trainer.strategy`).

    torchrun --nproc_per_node 2 -m minirl.train trainer.strategy=ddp hydra.run.dir=outputs/ddp

Every rank draws the same tasks, rolls out its share of the groups (whole groups, its own RNG stream) and
gathers everyone's, so that each holds the step's whole batch: dynamic sampling, guidance, advantages and
metrics are those of the global batch. The update splits each mini-batch's micro-batches over the ranks and
weights each so that the averaged gradient is the single process's (minirl/training/update.py).
"""
