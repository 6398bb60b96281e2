"""`jaxrl-dist serve`: the actor function over HTTP, with its own config (`serve.*`)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
from typing import Sequence

from jaxrl_dist.cli.compose import options, parse_args
from jaxrl_dist.config import ConfigError, ServeConfig, needs
from jaxrl_dist.platform import use_unrolled_threefry

EPILOG = """\
The port is $PORT when set (the Cloud Run / Knative / Container Apps contract),
else --port, else serve.port. A token is required: --token, serve.token or
$JAXRL_DIST_TOKEN; serve.token='' serves without authentication.
$JAXRL_DIST_ALLOWED_ENVS (comma-separated ids) and $JAXRL_DIST_MAX_BODY_MB set
serve.allowed_envs and serve.max_body_mb; overrides and flags win over them.

examples:
  JAXRL_DIST_TOKEN=secret jaxrl-dist serve --port 8001
  jaxrl-dist serve --token secret 'serve.allowed_envs=[CartPole-v1]' serve.max_body_mb=16
"""


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-dist serve", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="Serve the actor function (POST /v1/rollout) with uvicorn.")
    parser.add_argument("--host", help="interface to bind (default serve.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default serve.port); $PORT, when set, wins (the "
                        "platform's contract)")
    parser.add_argument("--token", help="bearer token (default $JAXRL_DIST_TOKEN)")
    parser.add_argument("overrides", nargs="*", metavar="serve.KEY=VALUE", help="e.g. serve.max_body_mb=16")
    args = parse_args(parser, argv)
    needs("uvicorn", "http", "jaxrl-dist serve")
    from jaxrl_dist.serve import app  # the HTTP stack

    try:
        base = app.config_from_env(ServeConfig())  # the environment, then overrides and flags
    except ValueError as err:
        raise ConfigError(str(err)) from None
    cfg = options(base, args.overrides, "serve")
    flags = {k: v for k in ("host", "port", "token") if (v := getattr(args, k)) is not None}
    if os.environ.get("PORT"):  # the platform's port wins (`app.serve`): checked as serve.port
        if args.port is not None and str(args.port) != os.environ["PORT"].strip():
            print(f"note: $PORT={os.environ['PORT']} wins over --port {args.port}", file=sys.stderr)
        flags["port"] = _port(os.environ["PORT"])
    cfg = dataclasses.replace(cfg, **flags).check()
    if cfg.token is None and not os.environ.get("JAXRL_DIST_TOKEN"):
        raise ConfigError("serve.token: no token; pass --token, set JAXRL_DIST_TOKEN, "
                          "or serve.token='' to serve without authentication")
    _check_address(cfg.host, cfg.port)
    use_unrolled_threefry()
    app.serve(cfg)
    return 0


def _check_address(host: str, port: int) -> None:
    """Something can listen on `host:port` (taken, or not this machine's address: uvicorn
    would say so in its own words, after the worker started)."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as err:
        why = os.strerror(err.errno) if err.errno else str(err)
        raise ConfigError(f"serve.host/serve.port: cannot listen on {host}:{port} ({why}); "
                          "pick another --port (or --host)") from None


def _port(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"$PORT: not a port number, got {text!r}") from None
