"""Recurrent actor-critics: a GRU or LSTM cell scanned over time (`algo.network=gru|lstm`).

The contract every recurrent network follows (a plugin's too):

- `recurrent = True` on the module, and `initialize_carry(n)`: the zero carry of `n` envs
  (any pytree of `[n, ...]` arrays);
- `apply(params, carry, obs[T, B, ...], reset[T, B]) -> (carry, PolicyOut[T, B])`: where
  `reset[t]` is set, the carry goes back to its initial value before observation `t`.

The rollout calls it with `T = 1` each step; the update replays whole segments from
their stored initial carries. The cell's input projection runs for all `T` steps at
once, outside the scan, so each serial step is one `[B, H] x [H, G*H]` product and the
gates' elementwise work; the scan is unrolled `unroll` steps at a time, which on CPU
removes most of a `while` loop's per-iteration cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.config import ConfigError
from jaxrl_dist.core.networks import _ACTIVATIONS, MLP, PolicyOut, _dense

_GATES = {"gru": 3, "lstm": 4}


def _gru(carry, gx, w_h, b_hn):
    """One GRU step (flax's `GRUCell` equations) from the input's precomputed gates `gx`."""
    return _gru_parts(carry, gx, w_h, b_hn)[0]


def _gru_parts(h, gx, w_h, b_hn):
    """`((h', h'), (r, z, n, hidden n-gate))`: the step and what its gradient needs."""
    H = h.shape[-1]
    gh = h @ w_h
    r = jax.nn.sigmoid(gx[..., :H] + gh[..., :H])
    z = jax.nn.sigmoid(gx[..., H:2 * H] + gh[..., H:2 * H])
    hn = gh[..., 2 * H:] + b_hn
    n = jnp.tanh(gx[..., 2 * H:] + r * hn)
    h = (1.0 - z) * n + z * h
    return (h, h), (r, z, n, hn)


def _reset(h, reset):
    return jnp.where(reset[:, None], 0.0, h)


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def gru_sequence(gx, h0, reset, w_h, b_hn, unroll: int = 1):
    """A GRU over `gx[T, B, 3H]` (the input's gate pre-activations) from `h0[B, H]`, the
    carry zeroed where `reset[T, B]`: `(h_T, hs[T, B, H])`.

    Its gradient is written out (`_gru_bwd`): the reverse scan carries only `dh` and
    each step's `[B, 3H] x [3H, H]` product, and the hidden weights' gradient is one
    `[H, T*B] x [T*B, 3H]` product after it; autodiff of the scan instead adds an outer
    product into the `[H, 3H]` weight gradient at every serial step (about half the
    update's time for a 128-step sequence here).
    """
    return _gru_fwd(gx, h0, reset, w_h, b_hn, unroll)[0]


def _gru_fwd(gx, h0, reset, w_h, b_hn, unroll):
    def step(h, xs):
        g, r = xs
        h = _reset(h, r)
        (h_new, _), parts = _gru_parts(h, g, w_h, b_hn)
        return h_new, (h_new, h, parts)

    hT, (hs, prev, parts) = jax.lax.scan(step, h0, (gx, reset), unroll=unroll)
    return (hT, hs), (prev, parts, reset, w_h)


def _gru_bwd(unroll, res, grads):
    prev, (r, z, n, hn), reset, w_h = res
    dhT, dhs = grads
    H = prev.shape[-1]

    def step(dh_next, xs):
        dh_out, h, r, z, n, hn, rs = xs
        dh = dh_out + dh_next
        dn = dh * (1.0 - z)
        dan = dn * (1.0 - n * n)  # through the tanh
        dar = dan * hn * r * (1.0 - r)
        daz = dh * (h - n) * z * (1.0 - z)
        dgh = jnp.concatenate([dar, daz, dan * r], axis=-1)
        dh_prev = dh * z + dgh @ w_h.T
        return _reset(dh_prev, rs), (jnp.concatenate([dar, daz, dan], axis=-1), dgh)

    dh0, (dgx, dgh) = jax.lax.scan(step, dhT, (dhs, prev, r, z, n, hn, reset), reverse=True, unroll=unroll)
    dw = jnp.einsum("tbh,tbg->hg", prev, dgh)
    db = dgh[..., 2 * H:].sum(axis=(0, 1))
    return dgx, dh0, None, dw, db


gru_sequence.defvjp(_gru_fwd, _gru_bwd)


def _lstm(carry, gx, w_h, _):
    """One LSTM step (input, forget, cell, output gates) from the input's gates `gx`."""
    c, h = carry
    H = h.shape[-1]
    g = gx + h @ w_h
    i, f = jax.nn.sigmoid(g[..., :H]), jax.nn.sigmoid(g[..., H:2 * H])
    cell, o = jnp.tanh(g[..., 2 * H:3 * H]), jax.nn.sigmoid(g[..., 3 * H:])
    c = f * c + i * cell
    h = o * jnp.tanh(c)
    return (c, h), h


class RecurrentActorCritic(nn.Module):
    """Embedding MLP -> GRU/LSTM -> separate actor and critic heads.

    `hidden_sizes[0]` is the embedding's width, the rest the heads' layers
    (`(128, 128)`, relu: PureJaxRL's GRU PPO); `hidden_size` the cell's.
    """

    num_actions: int
    discrete: bool
    cell: str = "gru"
    hidden_size: int = 128
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    obs_rank: int = 1
    unroll: int = 1
    recurrent = True

    def initialize_carry(self, n: int):
        zeros = jnp.zeros((n, self.hidden_size), jnp.float32)
        return zeros if self.cell == "gru" else (zeros, zeros)

    @nn.compact
    def __call__(self, carry, obs, reset) -> tuple:
        act = _ACTIVATIONS[self.activation]
        H, G = self.hidden_size, _GATES[self.cell]
        x = obs.reshape(obs.shape[: obs.ndim - self.obs_rank] + (-1,)).astype(jnp.float32)
        x = act(_dense(self.hidden_sizes[0], np.sqrt(2))(x))
        # the input half of every gate, for all steps in one product
        gx = nn.Dense(G * H, kernel_init=nn.initializers.lecun_normal(),
                      bias_init=nn.initializers.zeros, name="input")(x)
        w_h = self.param("hidden", nn.initializers.orthogonal(), (H, G * H))
        b_hn = self.param("hidden_bias", nn.initializers.zeros, (H,)) if self.cell == "gru" else None
        unroll = min(self.unroll, obs.shape[0])
        if self.cell == "gru":
            carry, hs = gru_sequence(gx, carry, reset, w_h, b_hn, unroll)
        else:
            def step(carry, xs):
                g, r = xs
                return _lstm(jax.tree.map(lambda c: _reset(c, r), carry), g, w_h, None)

            carry, hs = jax.lax.scan(step, carry, (gx, reset), unroll=unroll)
        heads = tuple(self.hidden_sizes[1:])
        logits = MLP(heads, self.activation, self.num_actions, 0.01)(hs)
        value = MLP(heads, self.activation, 1, 1.0)(hs)[..., 0]
        if self.discrete:
            log_std = jnp.zeros((self.num_actions,), jnp.float32)
        else:
            log_std = self.param("log_std", nn.initializers.zeros, (self.num_actions,))
        return carry, PolicyOut(logits, log_std, value)


@dataclass
class Options:
    """`algo.network_options` of `gru` and `lstm`."""

    hidden_size: int = 128  # the cell's width
    unroll: int = 1  # scan steps unrolled into one loop iteration (a speed knob; same math)

    def __post_init__(self):
        if not 0 < self.hidden_size <= 4096:
            raise ConfigError(f"algo.network_options.hidden_size must be in 1..4096, got {self.hidden_size}")
        if not 0 < self.unroll <= 256:
            raise ConfigError(f"algo.network_options.unroll must be in 1..256, got {self.unroll}")


def _factory(cell: str):
    def make(spec, hidden_sizes, activation, options: Options):
        if len(spec.obs_shape) == 3 and min(spec.obs_shape[1:]) >= 36:
            raise ConfigError(f"algo.network={cell}: image observations {list(spec.obs_shape)} need a "
                              "convolutional torso, which the recurrent networks do not have")
        return RecurrentActorCritic(spec.num_actions, spec.discrete, cell, options.hidden_size,
                                    tuple(hidden_sizes), activation, max(1, len(spec.obs_shape)),
                                    options.unroll)

    make.Options = Options
    return make


make_gru = _factory("gru")
make_lstm = _factory("lstm")
