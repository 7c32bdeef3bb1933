"""`python -m minirl.serve`: load the model, start the decoding worker and serve the app with uvicorn."""

from __future__ import annotations

import contextlib
import signal

from rich.console import Console

from minirl.bootstrap import model_path
from minirl.config import Config
from minirl.errors import ConfigError
from minirl.models.loading import load_model, load_tokenizer
from minirl.runtime import resolve_device
from minirl.serving.decoder import Decoder
from minirl.serving.scheduler import Scheduler
from minirl.validate import validate


def serve(cfg: Config, console: Console) -> None:
    """Serve `cfg.model` until SIGINT or SIGTERM. Once the socket accepts connections, prints exactly
    one line to stdout: `serving <model_id> at http://<host>:<port>/v1` (the real port when serve.port=0)."""
    try:  # late: the server stack (fastapi, uvicorn) is the optional [serve] extra
        import uvicorn

        from minirl.serving.app import ServedModel, create_app
        from minirl.serving.auth import resolve_api_key
    except ImportError as err:
        raise ConfigError(
            f'python -m minirl.serve needs the server stack ({err.name}): pip install -e ".[serve]"'
        ) from err
    validate(cfg)  # an unknown name fails before the model loads
    api_key = resolve_api_key(cfg.serve)  # and so does a host beyond loopback without a key
    path = model_path(cfg, console)
    model = load_model(path, cfg, resolve_device(cfg.trainer.device), trainable=False)  # the run's device setting
    tokenizer = load_tokenizer(path, cfg)
    served = ServedModel(cfg.serve.model_id or cfg.model.name_or_path, tokenizer, model.config.max_position_embeddings)
    scheduler = Scheduler(Decoder(model, tokenizer), cfg.serve.max_batch_size, cfg.serve.max_queue)
    app = create_app(scheduler, served, cfg.serve, cfg.protocol, api_key)
    # uvicorn waits this long for open streams after a signal before it closes them
    config = uvicorn.Config(app, cfg.serve.host, cfg.serve.port, log_level="warning", timeout_graceful_shutdown=5)
    sock = config.bind_socket()
    host = f"[{cfg.serve.host}]" if ":" in cfg.serve.host else cfg.serve.host
    ready_line = f"serving {served.model_id} at http://{host}:{sock.getsockname()[1]}/v1"

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                print(ready_line, flush=True)

    # uvicorn shuts down gracefully on SIGINT or SIGTERM, then raises the signal again with the handler it
    # found; SIGTERM's is made SIGINT's so that both end here, in a KeyboardInterrupt, and exit 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        AnnouncingServer(config).run(sockets=[sock])
