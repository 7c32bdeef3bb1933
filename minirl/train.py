"""`python -m minirl.train [overrides]`: agentic RL on the composed config.

python -m minirl.train                              # tiny model, synthetic tool tasks, CPU
python -m minirl.train loss=cispo rollout.max_turns=4
python -m minirl.train -m loss=grpo,cispo trainer.steps=2
python -m minirl.train --cfg job                    # print the composed config
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from minirl.entry import launch, run_entry


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(dict_cfg: DictConfig) -> None:
    run_entry(dict_cfg, _train)


def _train(cfg, console) -> None:
    from minirl.trainer import train  # after the config is validated: torch and friends load slowly

    train(cfg, console)


if __name__ == "__main__":
    launch(main)
