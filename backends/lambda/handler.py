"""AWS Lambda entry point for the actor function.

Wraps the same ASGI app that `jaxrl-dist serve` runs in Mangum, which turns a
Lambda Function URL, API Gateway (HTTP or REST API) or ALB event into an ASGI
request and the app's response back into the event's reply format:

    handler = Mangum(app_from_env(), lifespan="off")

The app reads its settings from the environment: JAXRL_DIST_TOKEN,
JAXRL_DIST_ALLOWED_ENVS, JAXRL_DIST_MAX_BODY_MB. As with `jaxrl-dist serve`,
a token is required: an unset JAXRL_DIST_TOKEN fails the cold start, and only
an explicitly empty one serves without authentication (behind a public
Function URL, anyone could then run rollouts on your account).

Inside Lambda (AWS_LAMBDA_FUNCTION_NAME is set) the app is built when this
module is imported, during the init phase, so importing JAX and building the
app happen before the first request is handed over, under the init phase's
own 10 s limit rather than the function timeout. Anywhere else,
importing this module has no side effects (no JAX, no Mangum); the app is then
built on the first call to `handler`.

Binary bodies: a Function URL or an HTTP API hands a binary request body to
Lambda base64-encoded and Mangum decodes it; Mangum base64-encodes a response
whose content type is not text, and the URL or API decodes it for the client.
A REST API does this only for the media types listed in its binaryMediaTypes
(use "*/*").

Size: Lambda caps a synchronous request and its response at 6 MB each,
including the base64 overhead of binary bodies (about 4.5 MB of msgpack), so
each shard's parameters and its returned trajectory must fit; deflate
compression (`Content-Encoding: deflate`) helps, and fewer envs or steps per
shard shrink the response.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

TOKEN_ENV = "JAXRL_DIST_TOKEN"

_adapter: Optional[Callable[[Any, Any], Any]] = None


def _build() -> Callable[[Any, Any], Any]:
    """The Mangum adapter around the actor function's ASGI app."""
    if TOKEN_ENV not in os.environ:
        raise RuntimeError(f"{TOKEN_ENV} is not set: set it to the bearer token the trainer "
                           "sends, or to an empty string to serve without authentication")
    from jaxrl_dist.platform import configure_cpu

    configure_cpu()  # before JAX starts, as the CLI does; XLA_FLAGS already set win
    from mangum import Mangum

    from jaxrl_dist.serve.app import app_from_env

    return Mangum(app_from_env(), lifespan="off")


def handler(event: Any, context: Any) -> Any:
    """Lambda handler (`handler.handler`)."""
    global _adapter
    if _adapter is None:
        _adapter = _build()
    return _adapter(event, context)


if os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
    # Init phase: a failure here fails the cold start loudly (the error and its
    # traceback go to CloudWatch) instead of every request.
    _adapter = _build()
