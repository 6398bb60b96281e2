"""The actor function: `jaxrl-dist serve`, an HTTP server that runs one rollout shard per
request, and the pieces it is made of.

- `app`: the ASGI app (routes, authentication, body limits, the 4xx/5xx answers), its
  configuration from the environment, and `serve(cfg)`, which runs it under uvicorn;
- `supervisor`: the rollout process the app sends shards to, restarted when it dies or hangs;
- `worker`: that process's own code (the only part that loads JAX);
- `pipe`: the bytes the two processes pass over their pipe;
- `protocol`: uvicorn's side (header timeout, ready line, stopping signal);
- `local`: a real server on a loopback port (`LocalServer`, `free_port`) for tools and tests.

Importing this package loads none of them (no uvicorn, no JAX): import the module you need.
"""
