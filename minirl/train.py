"""`python -m minirl.train [overrides]`: agentic RL on the composed config.

python -m minirl.train                              # tiny model, synthetic tool tasks, CPU
python -m minirl.train loss=cispo rollout.max_turns=4
python -m minirl.train -m loss=grpo,cispo trainer.steps=2
python -m minirl.train --cfg job                    # print the composed config
"""

from minirl.entry import cli

if __name__ == "__main__":
    cli("minirl.trainer:train")  # imported once the config is valid: torch loads slowly
