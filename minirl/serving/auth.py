"""The API key: where it comes from, when serving without one is refused, and the check on every request.

The key is serve.api_key, else $MINIRL_API_KEY (as vLLM reads VLLM_API_KEY): the environment keeps it out
of config dumps, Hydra's saved overrides and logs. With a key, every request but `GET /health` must send
`Authorization: Bearer <key>`; the check runs before routing and body parsing, so a client without the key
learns nothing else (not which paths exist, not whether its JSON is valid).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from minirl.config import ServeConfig
from minirl.errors import ConfigError
from minirl.serving.openai_api import error_body

API_KEY_ENV = "MINIRL_API_KEY"
OPEN_PATHS = ("/health",)  # for load balancers and launch scripts; says nothing about the model


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost; any other name or address (0.0.0.0 and :: too) reaches further."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def resolve_api_key(serve: ServeConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """serve.api_key, else $MINIRL_API_KEY (empty counts as unset), else None. ConfigError for a key that
    cannot travel in an HTTP header, and for a host beyond loopback without a key unless
    serve.allow_unauthenticated. Never shows the key."""
    key, source = serve.api_key, "serve.api_key"
    if not key:
        key, source = environ.get(API_KEY_ENV), API_KEY_ENV
    if key and not (key.isascii() and key.isprintable() and " " not in key):
        raise ConfigError(f"{source}: the API key must be printable ASCII without spaces (it is sent in a header)")
    if not key and not serve.allow_unauthenticated and not is_loopback(serve.host):
        raise ConfigError(
            f"serve.host={serve.host} is not a loopback address and no API key is set: set "
            f"{API_KEY_ENV}=<key> (or serve.api_key=<key>), serve on serve.host=127.0.0.1, "
            "or pass serve.allow_unauthenticated=true to serve without a key"
        )
    return key or None


class BearerAuth:
    """ASGI middleware: a 401 OpenAI error unless the request sends `Authorization: Bearer <key>`; the key is
    compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:  # lifespan passes; no websocket routes
            token = _bearer_token(scope)
            if token is None or not hmac.compare_digest(token, self.key):
                message = (
                    "Incorrect API key provided"
                    if token is not None
                    else "no API key provided: send the header `Authorization: Bearer <key>`"
                )
                body = error_body(message, "invalid_request_error", code="invalid_api_key")
                await JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _bearer_token(scope: Scope) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header (the scheme in any case); None without one."""
    for name, value in scope["headers"]:  # ASGI header names are lower-case bytes
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None
