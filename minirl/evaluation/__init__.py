"""Evaluation of a policy's tool use on a dataset's held-out tasks (`python -m minirl.eval`).

    backends.py   EVAL_BACKENDS: where trajectories come from (`local`: run_agent in this process;
                  `openai`: any OpenAI-compatible endpoint)
    chat_loop.py  the openai backend's message-level agent loop, mirroring run_agent
    evaluator.py  evaluate(cfg, console): tasks -> backend -> rewards -> report
    report.py     the metrics, per-tool and per-task results; JSON file and console tables
    compare.py    two report files side by side (`python -m minirl.eval --compare A.json B.json`)

Both backends produce the same `Trajectory` objects, so the same reward and success code scores them.
"""
