"""`python -m minirl.eval [overrides]`: how well a policy uses tools on a dataset's held-out tasks.

python -m minirl.eval model.name_or_path=outputs/.../checkpoint       # in-process, greedy, one sample
python -m minirl.eval eval.samples=8 eval.temperature=1.0 eval.max_tasks=32   # avg@8 and pass@8
python -m minirl.eval eval.backend=openai eval.base_url=http://127.0.0.1:8000/v1   # any compatible server
python -m minirl.eval data=jsonl data.path=tasks.jsonl data.heldout_path=heldout.jsonl
python -m minirl.eval --compare A.json B.json [--markdown]           # two reports side by side, tasks paired

The report goes to the console and to eval.output (default eval.json in the run directory).
"""

import sys

from minirl.entry import cli

if __name__ == "__main__":
    if "--compare" in sys.argv[1:]:  # not a Hydra run: two report files
        from minirl.evaluation.compare import main as compare  # late: only this mode needs it

        sys.exit(compare(sys.argv[1:]))
    cli("minirl.evaluation.evaluator:evaluate")  # imported once the config is valid
