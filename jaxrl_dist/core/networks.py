"""Actor-critic networks (flax linen) and the action distributions they define.

Torsos: an MLP (separate actor and critic towers) and the Nature Atari CNN
(shared torso). Heads: categorical logits for discrete actions, a Gaussian with
state-independent log-std for continuous ones. `make_network` picks both from
the env's spaces.
"""
from __future__ import annotations

import re
from typing import NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.core.types import EnvSpec
from jaxrl_dist.config import ConfigError
from jaxrl_dist.registry import Registry, made, options as plugin_options


class PolicyOut(NamedTuple):
    """Network output for a batch: `[..., A]` logits or mean, `[A]` log-std (or `[..., A]`,
    one per state), `[...]` value."""

    logits: jax.Array  # categorical logits, or Gaussian mean
    log_std: jax.Array  # unused (zeros) for discrete actions
    value: jax.Array


def _dense(features: int, scale: float) -> nn.Dense:
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale),
                    bias_init=nn.initializers.constant(0.0))


_ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


class MLP(nn.Module):
    hidden_sizes: Sequence[int]
    activation: str
    out: int
    out_scale: float

    @nn.compact
    def __call__(self, x):
        act = _ACTIVATIONS[self.activation]
        for size in self.hidden_sizes:
            x = act(_dense(size, np.sqrt(2))(x))
        return _dense(self.out, self.out_scale)(x)


class NatureCNN(nn.Module):
    """The DQN/PPO Atari torso; takes `[..., C, H, W]` uint8 frames (envpool layout)."""

    @nn.compact
    def __call__(self, obs):
        x = jnp.moveaxis(obs, -3, -1).astype(jnp.float32) / 255.0
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID",
                                kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        return nn.relu(_dense(512, np.sqrt(2))(x))


class ActorCritic(nn.Module):
    num_actions: int
    discrete: bool
    torso: str = "mlp"  # mlp | cnn
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    obs_rank: int = 1  # trailing observation axes, flattened for the MLP

    @nn.compact
    def __call__(self, obs) -> PolicyOut:
        if self.torso == "cnn":
            h = NatureCNN()(obs)
            logits = _dense(self.num_actions, 0.01)(h)
            value = _dense(1, 1.0)(h)[..., 0]
        else:
            x = obs.reshape(obs.shape[: obs.ndim - self.obs_rank] + (-1,)).astype(jnp.float32)
            logits = MLP(self.hidden_sizes, self.activation, self.num_actions, 0.01)(x)
            value = MLP(self.hidden_sizes, self.activation, 1, 1.0)(x)[..., 0]
        if self.discrete:
            log_std = jnp.zeros((self.num_actions,), jnp.float32)
        else:
            log_std = self.param("log_std", nn.initializers.zeros, (self.num_actions,))
        return PolicyOut(logits, log_std, value)


# The Nature CNN's VALID convolutions need frames of at least 36x36.
_MIN_FRAME = 36


def is_frame_stack(obs_shape) -> bool:
    """`[C, H, W]` stacked frames (envpool Atari layout) large enough for the CNN.

    Small image-like observations (MinAtar's 10x10x4) go to the MLP instead.
    """
    return len(obs_shape) == 3 and min(obs_shape[1:]) >= _MIN_FRAME


BUILTIN = ("auto", "mlp", "cnn")  # the feed-forward built-ins (no options)
RECURRENT = ("gru", "lstm")  # the recurrent built-ins (`core.recurrent`; options: hidden_size, unroll)
# `algo.network`: a plugin is a factory `(spec, hidden_sizes, activation, options) -> module`
# whose `apply(params, obs[N, ...])` returns a `PolicyOut`, or, for a module with
# `recurrent = True`, the contract in `core.recurrent`; entry-point group `jaxrl_dist.networks`
NETWORKS = Registry("network", "algo.network", "jaxrl_dist.networks",
                    {**{name: "jaxrl_dist.core.networks:make_network" for name in BUILTIN},
                     **{name: f"jaxrl_dist.core.recurrent:make_{name}" for name in RECURRENT}})


def make_network(spec: EnvSpec, network: str = "auto", hidden_sizes=(64, 64),
                 activation: str = "tanh", options=None):
    """Build the actor-critic for an env: CNN for image observations, else MLP, or the
    plugin `network` names with its `options` (a mapping it validates)."""
    factory, opts = checked_network(network, options)
    if factory is not None:
        module = made("algo.network", network, factory, "factory(spec, hidden_sizes, activation, options) -> "
                      "flax module", ("init", "apply"), spec, tuple(hidden_sizes), activation, opts)
        return check_output(module, spec, f"algo.network={network}")
    torso = network
    if torso == "auto":
        torso = "cnn" if is_frame_stack(spec.obs_shape) else "mlp"
    if torso == "cnn" and not is_frame_stack(spec.obs_shape):  # the convolutions would have nothing left to see
        raise ConfigError(f"algo.network=cnn: {spec.env_id}'s observations are {tuple(spec.obs_shape)}; the CNN "
                          f"takes stacked frames [C, H, W] of at least {_MIN_FRAME}x{_MIN_FRAME} (envpool's Atari "
                          "layout): use algo.network=mlp (or auto)")
    return ActorCritic(spec.num_actions, spec.discrete, torso, tuple(hidden_sizes), activation,
                       max(1, len(spec.obs_shape)))


def check_output(network, spec: EnvSpec, what: str):
    """`network`, once its output on dummy observations (abstractly: nothing runs) has
    `PolicyOut`'s shapes, else one line naming `what` and the contract, not a shape error
    deep in the loss. A feed-forward network is called on any leading dims (`[B, ...obs]`
    a step, `[T, B, ...obs]` a trajectory's bootstrap values), so both are tried; a
    recurrent one returns `(carry, PolicyOut[1, 2])` for one step."""
    B, recurrent = 2, is_recurrent(network)
    for lead in [(1, B)] if recurrent else [(B,), (2, B)]:
        _check_lead(network, spec, what, lead)
    return network


def _check_lead(network, spec: EnvSpec, what: str, lead: tuple) -> None:
    A, recurrent = spec.num_actions, is_recurrent(network)

    def apply():
        params = init_params(network, spec.obs_shape, spec.obs_dtype, jax.random.key(0))
        obs = jnp.zeros(lead + tuple(spec.obs_shape), spec.obs_dtype)
        if not recurrent:
            return network.apply(params, obs)
        out = network.apply(params, network.initialize_carry(lead[1]), obs, jnp.zeros(lead, bool))
        return out[1] if isinstance(out, tuple) and len(out) == 2 else out

    dims = ", ".join(map(str, lead))
    contract = (f"a {'recurrent ' * recurrent}network returns {'(carry, ...) with ' * recurrent}PolicyOut(logits or "
                f"mean [{dims}, {A}], log_std [{A}] or [{dims}, {A}], value [{dims}])"
                + ("" if recurrent else " for observations of any leading dims"))
    where = f"on observations [{dims}, {', '.join(map(str, spec.obs_shape))}]"
    try:
        out = jax.eval_shape(apply)
    except Exception as err:  # a plugin's own error inside apply: its first line, then the contract
        first = re.sub(r"\s*\(https?://\S*", "", (str(err).splitlines() or [""])[0])[:200]  # no docs link
        raise ConfigError(f"{what}: {where} it raised {type(err).__name__}: {first}; {contract}") from None
    shapes = [tuple(getattr(x, "shape", ())) for x in out] if isinstance(out, tuple) and len(out) == 3 else None
    ok = shapes is not None and shapes[0] == lead + (A,) and shapes[2] == lead and (
        spec.discrete or shapes[1] in ((A,), lead + (A,)))
    if not ok:
        got = f"{type(out).__name__} of shapes {shapes}" if shapes else type(out).__name__
        raise ConfigError(f"{what}: {where} it returned {got}; {contract}")


def checked_network(network: str, options=None) -> tuple:
    """`(factory, options)` of the network `network` names, its options checked by it;
    `(None, None)` for a built-in feed-forward one (which takes no options)."""
    if network not in BUILTIN:
        factory = NETWORKS.get(network)
        return factory, plugin_options(factory, options or {}, "algo.network_options")
    if options:
        raise ConfigError(f"algo.network_options.{sorted(options)[0]}: the built-in networks take no options")
    return None, None


def is_recurrent(network) -> bool:
    """Whether `network` follows the recurrent contract (`core.recurrent`)."""
    return bool(getattr(network, "recurrent", False))


def initial_carry(network, n: int):
    """The zero carry of `n` envs (None for a feed-forward network)."""
    return network.initialize_carry(n) if is_recurrent(network) else None


def init_params(network, obs_shape: tuple, obs_dtype, key):
    """Parameters from a one-observation dummy input (one step of one env when recurrent)."""
    obs = jnp.zeros((1,) + tuple(obs_shape), obs_dtype)
    if not is_recurrent(network):
        return network.init(key, obs)
    return network.init(key, network.initialize_carry(1), obs[None], jnp.zeros((1, 1), bool))


def step(network, params, carry, obs, reset):
    """One step of `B` envs: `(carry, PolicyOut[B])`; a feed-forward network passes
    `carry` (None) through."""
    if not is_recurrent(network):
        return carry, network.apply(params, obs)
    carry, out = network.apply(params, carry, obs[None], reset[None])
    log_std = out.log_std[0] if out.log_std.ndim == out.logits.ndim else out.log_std  # per state: `[1, B, A]`
    return carry, PolicyOut(out.logits[0], log_std, out.value[0])


def replay(apply_fn, params, carry, obs, reset):
    """`PolicyOut` of whole segments: `obs[T, B, ...]` from their initial `carry` with the
    `reset` flags they were collected with (recurrent), or `obs[...]` at once (carry None)."""
    if carry is None:
        return apply_fn(params, obs)
    return apply_fn(params, carry, obs, reset)[1]


# a masked action's logit: finite, so a fully masked row stays a (uniform) distribution
# and its entropy is 0 * large, not 0 * inf
MASKED_LOGIT = -1e9


def mask_logits(out: PolicyOut, mask) -> PolicyOut:
    """`out` with the actions `mask` (`[..., A]` bool; None: all) rules out made impossible."""
    if mask is None:
        return out
    return out._replace(logits=jnp.where(mask, out.logits, MASKED_LOGIT))


# ---- distributions -------------------------------------------------------

_LOG_2PI = float(np.log(2 * np.pi))


def sample_action(out: PolicyOut, key: jax.Array, discrete: bool) -> jax.Array:
    if discrete:
        return jax.random.categorical(key, out.logits)
    noise = jax.random.normal(key, out.logits.shape, out.logits.dtype)
    return out.logits + jnp.exp(out.log_std) * noise


def log_prob(out: PolicyOut, action: jax.Array, discrete: bool) -> jax.Array:
    if discrete:
        # a one-hot product, not a gather: its gradient is a multiply, not a
        # scatter, which matters for small action sets on CPU
        logp = jax.nn.log_softmax(out.logits)
        return jnp.sum(logp * jax.nn.one_hot(action, logp.shape[-1], dtype=logp.dtype), axis=-1)
    z = (action - out.logits) * jnp.exp(-out.log_std)
    return jnp.sum(-0.5 * z * z - out.log_std - 0.5 * _LOG_2PI, axis=-1)


def entropy(out: PolicyOut, discrete: bool) -> jax.Array:
    if discrete:
        logp = jax.nn.log_softmax(out.logits)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    per_dim = out.log_std + 0.5 * (1.0 + _LOG_2PI)
    return jnp.broadcast_to(jnp.sum(per_dim, axis=-1), out.value.shape)  # `[A]` or per state `[..., A]`
