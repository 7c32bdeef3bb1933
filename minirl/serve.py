"""`python -m minirl.serve [overrides]`: an OpenAI-compatible chat-completions server for `model`.

python -m minirl.serve                                          # the embedded tiny model on 127.0.0.1:8000
python -m minirl.serve model.name_or_path=./outputs/ckpt serve.port=0   # any free port (printed)
export MINIRL_API_KEY=$(openssl rand -hex 16)                   # the key clients send: OpenAI(api_key=...)
python -m minirl.serve model=qwen2.5-0.5b serve.host=0.0.0.0 serve.max_batch_size=32   # other machines too

Once it accepts connections it prints `serving <model_id> at http://<host>:<port>/v1`; point any
OpenAI client at that URL. With an API key (serve.api_key, else $MINIRL_API_KEY; the variable keeps it
out of .hydra/overrides.yaml) every request but `GET /health` needs `Authorization: Bearer <key>`
(OpenAI(api_key=key)), else 401. Without one, a host other than loopback is refused unless
serve.allow_unauthenticated=true. `protocol.format` decides how tool calls are read, `trainer.device`
where the model runs (auto: CUDA when there is one); minirl/serving has the rest.
"""

from minirl.entry import cli

if __name__ == "__main__":
    cli("minirl.serving.server:serve")  # imported once the config is valid: torch loads slowly
