"""PPO: GAE, the clipped losses and the jitted update (epochs x minibatches).

All functions work on one seed; the trainers vmap them over seeds.
Shapes are time-major: `[T, B]` for per-step values.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from jaxrl_dist.core import networks, rng
from jaxrl_dist.config import TRACED, AlgoConfig, ConfigError
from jaxrl_dist.core.types import TrainState, Transition
from jaxrl_dist.registry import Registry, check_call, options as plugin_options

# `algo.loss`: `loss(params, apply_fn, batch, opts, options) -> (scalar, {name: metric})`;
# plugins under the entry-point group `jaxrl_dist.losses` (see `ppo_loss`)
LOSSES = Registry("loss", "algo.loss", "jaxrl_dist.losses", {"ppo": "jaxrl_dist.core.ppo:ppo_loss"})


_ALGO = AlgoConfig()  # the PPO fields' defaults come from the config: one source


class Hyper(NamedTuple):
    """One member's traced coefficients (`config.TRACED`): float32 arrays that live in
    its `TrainState.hyper`, so a new value is a new input, not a new program. Under
    the trainers' vmap each field is one scalar per seed."""

    lr: Any
    max_grad_norm: Any
    ent_coef: Any
    vf_coef: Any
    clip_eps: Any
    gamma: Any
    gae_lambda: Any


assert Hyper._fields == tuple(k.split(".")[1] for k in TRACED)


def hyper(a) -> Hyper:
    """The traced coefficients of an `AlgoConfig`, as float32 scalars."""
    return Hyper(*(jnp.asarray(getattr(a, f), jnp.float32) for f in Hyper._fields))


class PPOOptions(NamedTuple):
    """PPO settings closed over by the update: `algo.*` by name (`options`), then what
    the trainer knows about its batch. Where the train state carries a `Hyper`, the
    update replaces the traced fields (gamma, gae_lambda, clip_eps, ent_coef, vf_coef)
    with its arrays before the loss sees them, so a loss must treat those as numbers
    (arithmetic, `jnp.where`), never as Python values (`if`, `float()`)."""

    gamma: float = _ALGO.gamma
    gae_lambda: float = _ALGO.gae_lambda
    clip_eps: float = _ALGO.clip_eps
    clip_vloss: bool = _ALGO.clip_vloss
    ent_coef: float = _ALGO.ent_coef
    vf_coef: float = _ALGO.vf_coef
    update_epochs: int = _ALGO.update_epochs
    num_minibatches: int = _ALGO.num_minibatches
    norm_adv: bool = _ALGO.norm_adv
    discrete: bool = True
    masked: bool = False  # some transitions are invalid (envpool reset steps)
    unroll: bool = False  # unroll the minibatch loop (see `learner.loop_free`)
    minibatch_size: int = 0  # > 0: minibatches of this size over the real samples (see `make_update`)
    rho_bar: float = 1.0  # stale samples: truncation of the V-trace importance weights ...
    c_bar: float = 1.0  # ... and of its trace coefficients (see `make_batch`)
    loss: Any = None  # the loss function (None: `ppo_loss`)
    loss_options: Any = None  # its validated options record (`registry.options`)
    batch_sharding: Any = None  # data-parallel: where a minibatch's samples go (`core.mesh.samples`)
    # `(lr, max_grad_norm) -> optax transform`: the optimiser built from a member's traced
    # values in each update (None: the train state's own `tx`, its values constants)
    make_tx: Any = None


def options(a, loss=None, **settings) -> PPOOptions:
    """`PPOOptions` from an `AlgoConfig`: every field the config shares by name, then
    `settings` (discrete, masked, unroll, num_minibatches, ...). The loss is `loss`,
    else the one `algo.loss` names, with `algo.loss_options` checked by it."""
    shared = {f: getattr(a, f) for f in PPOOptions._fields if f in type(a).__dataclass_fields__
              and f not in ("minibatch_size", "loss")}
    fn, opts = checked_loss(a, loss)
    return PPOOptions(**{**shared, **settings, "loss": fn, "loss_options": opts})


_LOSS_CONTRACT = "loss(params, apply_fn, batch, opts, options) -> (scalar, {name: scalar metric})"


def checked_loss(a, loss=None) -> tuple:
    """`(loss, options)`: `loss`, else the one `algo.loss` names, and `algo.loss_options`
    checked by it (`ConfigError`, one line, for an unknown name or option, or a loss that
    cannot be called with the contract's five arguments)."""
    fn = loss if loss is not None else LOSSES.get(a.loss)
    check_call(f"algo.loss={a.loss if loss is None else _name(fn)}: it cannot be called as {_LOSS_CONTRACT}",
               fn, *range(5))
    return fn, plugin_options(fn, a.loss_options, "algo.loss_options")


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _checked_out(out, fn):
    """A loss's `(loss, metrics)` at trace time: a scalar and a mapping of scalars, else one
    line naming the loss (a wrong structure failed as a shape error far from it)."""
    ok = isinstance(out, tuple) and len(out) == 2 and jnp.shape(out[0]) == () and isinstance(out[1], dict)
    bad = [k for k, v in out[1].items() if jnp.shape(v) != ()] if ok else []
    if not ok or bad:
        raise ConfigError(f"algo.loss: the loss {_name(fn)} returned {_what(out, bad)}; a loss is {_LOSS_CONTRACT}")
    return out


def _what(out, bad: list) -> str:
    """What a loss returned that the contract does not take, in its terms (shapes, not tracers)."""
    if bad:
        return f"metrics {bad} that are not scalars"
    if hasattr(out, "shape"):
        return f"one array of shape {tuple(out.shape)}, not a (loss, metrics) pair"
    if not (isinstance(out, tuple) and len(out) == 2):
        return f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, tuple) else "")
    if jnp.shape(out[0]) != ():
        return f"a loss of shape {tuple(jnp.shape(out[0]))}, not a scalar (a per-sample loss wants its mean)"
    return f"metrics as a {type(out[1]).__name__}, not a dict"


def check_plugins(a: AlgoConfig) -> None:
    """The network and loss an `AlgoConfig` names, and their options: a run checks them
    before it writes anything (`ConfigError`, one line)."""
    networks.checked_network(a.network, a.network_options)
    checked_loss(a)


class Batch(NamedTuple):
    """One minibatch for the loss: flat `[M, ...]` for a feed-forward network; for a
    recurrent one, `M` whole sequences, time-major `[T, M, ...]`, with their initial
    `carry` (`[M, ...]`) and `reset` flags. Get the network's output on it with
    `policy_out`, which replays the sequences and applies the action masks."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    target: jax.Array
    valid: jax.Array
    carry: Any = None  # recurrent: the sequences' initial carries
    reset: Any = None  # recurrent: `[T, M]`, the carry was reset before this step
    action_mask: Any = None  # masked envs: `[..., A]` the legal actions of `obs`


def policy_out(apply_fn, params, batch) -> networks.PolicyOut:
    """The network's output on a `Batch` (or a `[T, B]` `Transition` with its segments'
    initial carries): replayed from the carries when recurrent, with the masked actions'
    logits made impossible where the batch has masks."""
    carry = batch.carry
    if carry is not None and isinstance(batch, Transition):  # `[1, B, ...]`: the segment start
        carry = jax.tree.map(lambda c: c[0], carry)
    out = networks.replay(apply_fn, params, carry, batch.obs, batch.reset)
    return networks.mask_logits(out, batch.action_mask)


def gae(reward, value, next_value, terminated, done, gamma: float, lam: float,
        rho=None, trace=None):
    """Generalised advantage estimates, `[T, ...]` each, time-major.

    `next_value[t]` is the value of the observation transition `t` ended in
    (before any auto-reset): it bootstraps truncated episodes and is cut only
    by `terminated`. `done` (terminated or truncated) stops the recursion.
    Returns `(advantages, value_targets)`.

    With `rho` and `trace` (truncated importance weights `min(rho_bar, pi/mu)`
    and `min(c_bar, pi/mu)` of samples from an older policy `mu`) the targets
    are V-trace's, `v_t = V_t + rho_t delta_t + gamma lam trace_t (v_{t+1} - V_{t+1})`,
    and the advantages `v_t - V_t`: where both weights are 1 this is GAE exactly.
    """
    delta = reward + gamma * (1.0 - terminated) * next_value - value
    carry_scale = gamma * lam * (1.0 - done)
    if rho is not None:
        delta, carry_scale = rho * delta, carry_scale * trace

    def backward(adv_next, xs):
        d, c = xs
        adv = d + c * adv_next
        return adv, adv

    _, adv = jax.lax.scan(backward, jnp.zeros_like(delta[0]), (delta, carry_scale), reverse=True)
    return adv, adv + value


def _mean(x, w):
    return x.mean() if w is None else (x * w).sum() / jnp.maximum(w.sum(), 1.0)


def ppo_loss(params, apply_fn: Callable, batch: Batch, opts: PPOOptions, options=None):
    """Clipped-surrogate PPO loss of one minibatch; returns `(loss, metrics)`. Every
    metric returned is logged under its own name (a plugin loss may add its own)."""
    w = batch.valid.astype(jnp.float32) if opts.masked else None
    out = policy_out(apply_fn, params, batch)
    logp = networks.log_prob(out, batch.action, opts.discrete)
    log_ratio = logp - batch.log_prob
    ratio = jnp.exp(log_ratio)
    adv = batch.advantage
    if opts.norm_adv:
        mean = _mean(adv, w)
        adv = (adv - mean) / (jnp.sqrt(_mean((adv - mean) ** 2, w)) + 1e-8)
    pg_loss = _mean(-jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - opts.clip_eps, 1 + opts.clip_eps) * adv), w)
    v_err = (out.value - batch.target) ** 2
    if opts.clip_vloss:
        v_clipped = batch.value + jnp.clip(out.value - batch.value, -opts.clip_eps, opts.clip_eps)
        v_err = jnp.maximum(v_err, (v_clipped - batch.target) ** 2)
    v_loss = 0.5 * _mean(v_err, w)
    ent = _mean(networks.entropy(out, opts.discrete), w)
    loss = pg_loss + opts.vf_coef * v_loss - opts.ent_coef * ent
    metrics = {
        "loss": loss, "pg_loss": pg_loss, "v_loss": v_loss, "entropy": ent,
        "approx_kl": _mean((ratio - 1.0) - log_ratio, w),
        "clipfrac": _mean((jnp.abs(ratio - 1.0) > opts.clip_eps).astype(jnp.float32), w),
    }
    return loss, metrics


def make_optimizer(lr, max_grad_norm, adam_eps: float, anneal_steps: int = 0):
    """Adam with global-norm clipping; linear LR decay to 0 over `anneal_steps` if > 0.

    `lr` and `max_grad_norm` may be traced arrays (a member's `Hyper`): the state
    (Adam's moments and counts) does not depend on them, so an update builds this
    transform from the member's values each time and an annealed rate stays an input
    (the schedule's fraction times the rate), not a constant of the program. The
    optimiser works on the parameters raveled into one vector: with many small
    leaves, per-leaf optimiser kernels cost more than the math.
    """
    schedule = optax.linear_schedule(lr, 0.0, anneal_steps) if anneal_steps else lr
    return optax.flatten(optax.chain(optax.clip_by_global_norm(max_grad_norm),
                                     optax.adam(schedule, eps=adam_eps)))


def next_values(apply_fn, params, traj: Transition, last_value):
    """Value of the observation each transition ended in, `[T, B]`.

    Where the final observation is the next one (envpool), it is the next
    step's value, and the last one is `last_value` (`[B]`, the rollout's
    bootstrap); otherwise (auto-reset envs) the stored final observations are
    evaluated in one batched call.
    """
    if traj.next_value is not None:  # recurrent: computed in the rollout
        return traj.next_value
    if traj.final_obs is None:
        return jnp.concatenate([traj.value[1:], last_value[None]], axis=0)
    return apply_fn(params, traj.final_obs).value


def _off_policy(apply_fn, params, traj: Transition, stale, opts: PPOOptions):
    """Values and truncated importance weights `(value, rho, trace)` for a
    trajectory whose `stale` `[T, B]` samples came from an older policy: those
    get the current value function's values and weights `pi/mu` against their
    behaviour log-probs; the others keep their own values and weight 1."""
    out = policy_out(apply_fn, params, traj)
    value = jnp.where(stale, out.value, traj.value)
    log_rho = networks.log_prob(out, traj.action, opts.discrete) - traj.log_prob
    ratio = jnp.exp(jnp.where(stale, log_rho, 0.0))
    return value, jnp.minimum(opts.rho_bar, ratio), jnp.minimum(opts.c_bar, ratio)


def make_batch(apply_fn, params, traj: Transition, last_value, opts: PPOOptions, stale=None) -> Batch:
    """GAE over one seed's `[T, B]` trajectory, flattened to `[T * B]`; with
    `stale` (`[T, B]` bool), V-trace-corrected GAE (see `gae`). The loss's
    ratio is always against the behaviour log-probs, so PPO's clip bounds how
    far an update follows a stale sample."""
    value, rho, trace = traj.value, None, None
    term = traj.terminated.astype(jnp.float32)
    done = jnp.maximum(term, traj.truncated.astype(jnp.float32))
    if stale is not None:
        value, rho, trace = _off_policy(apply_fn, params, traj, stale, opts)
        if traj.next_value is not None:  # within an episode, the next step's corrected value
            later = jnp.concatenate([value[1:], traj.next_value[-1:]], axis=0)
            traj = traj._replace(next_value=jnp.where(done > 0, traj.next_value, later))
        traj = traj._replace(value=value)
    nv = next_values(apply_fn, params, traj, last_value)
    adv, target = gae(traj.reward, value, nv, term, done, opts.gamma, opts.gae_lambda, rho, trace)
    if traj.carry is not None:  # whole sequences, time-major, from their initial carries
        return Batch(traj.obs, traj.action, traj.log_prob, value, adv, target, traj.valid,
                     jax.tree.map(lambda c: c[0], traj.carry), traj.reset, traj.action_mask)
    flat = lambda x: None if x is None else x.reshape((-1,) + x.shape[2:])  # noqa: E731
    return Batch(flat(traj.obs), flat(traj.action), flat(traj.log_prob), flat(value),
                 flat(adv), flat(target), flat(traj.valid), action_mask=flat(traj.action_mask))


def _minibatch(batch: Batch, idx) -> Batch:
    """Samples `idx` of a flat batch, or sequences `idx` of a recurrent one."""
    if batch.carry is None:
        return jax.tree.map(lambda x: x[idx], batch)
    seqs = jax.tree.map(lambda x: x[:, idx], batch._replace(carry=None))
    return seqs._replace(carry=jax.tree.map(lambda c: c[idx], batch.carry))


def _plan(key, n: int, real, opts: PPOOptions, size: int = 0):
    """Minibatch indices `[S, size]` and which of the `S` steps run.

    Without `opts.minibatch_size`: every epoch splits the whole batch into
    `num_minibatches`. With it, the batch may be padded (`real[n]` marks the
    samples that exist): each epoch shuffles the real samples to the front
    and runs `ceil(real / minibatch_size)` steps, so a bigger round takes more
    gradient steps with the same static shapes (the rest are skipped).
    """
    E = opts.update_epochs
    keys = jax.random.split(key, E)
    if not opts.minibatch_size:
        m = opts.num_minibatches
        perms = jax.vmap(lambda k: rng.permutation(k, n))(keys)
        return perms.reshape(E * m, n // m), jnp.ones((E * m,), bool)
    size = size or opts.minibatch_size
    real = jnp.ones((n,), bool) if real is None else real
    order = lambda k: rng.argsort(jnp.where(real, jax.random.uniform(k, (n,)), 2.0))
    perms = jax.vmap(order)(keys)
    steps = -(-real.sum() // size)
    active = jnp.tile(jnp.arange(n // size) < steps, E)
    return perms.reshape(E * (n // size), size), active


def make_update(apply_fn: Callable, opts: PPOOptions):
    """Build `update(train_state, traj[T,B], last_value[B], key, real=None, stale=None)
    -> (train_state, metrics)`.

    `real` (`[T, B]` bool, optional) marks the transitions that exist in a
    padded batch; it only sizes the epochs under `opts.minibatch_size` (the
    loss masks by `traj.valid`). `stale` (`[T, B]` bool, optional) marks
    samples of an older policy, corrected as `make_batch` says. The minibatch loop carries the parameters
    raveled into one vector (the optimiser is `optax.flatten`-ed to match),
    so each step updates one array instead of one per layer.
    """

    def update(state: TrainState, traj: Transition, last_value, key, real=None, stale=None):
        opts_t, tx = traced(opts, state)
        batch = make_batch(apply_fn, state.params, traj, last_value, opts_t, stale)
        if batch.carry is None:
            n, size, real = batch.advantage.shape[0], 0, None if real is None else real.reshape(-1)
        else:  # minibatches of whole sequences (`config` checks the size is a whole number)
            T, n = batch.advantage.shape[:2]
            size, real = opts.minibatch_size // T, None if real is None else real[0]
        idx, active = _plan(key, n, real, opts, size)
        flat, unravel = ravel_pytree(state.params)
        loss_fn = opts.loss or ppo_loss
        grad_fn = jax.value_and_grad(
            lambda f, mb: _checked_out(loss_fn(unravel(f), apply_fn, mb, opts_t, opts.loss_options), loss_fn),
            has_aux=True)

        def sgd_step(flat, opt_state, mb_idx):
            mb = _minibatch(batch, mb_idx)
            if opts.batch_sharding is not None and mb.carry is None:  # each device takes the gradient of its part
                mb = jax.lax.with_sharding_constraint(mb, opts.batch_sharding)
            (_, metrics), grads = grad_fn(flat, mb)
            updates, new_opt = tx.update(grads, opt_state, flat)
            return flat + updates, new_opt, metrics

        loop = _active_loop if opts.minibatch_size and not opts.unroll else partial(_scan_loop, opts=opts)
        flat, opt_state, metrics = loop(sgd_step, flat, state.opt_state, idx, active)
        state = state.replace(params=unravel(flat), opt_state=opt_state, step=state.step + active.sum())
        return state, metrics

    return update


def traced(opts: PPOOptions, state: TrainState) -> tuple:
    """`(opts, tx)` for one update: with the state's `Hyper`, the options' coefficients
    and the optimiser made from its arrays; without one, `opts` and the state's `tx`."""
    h = state.hyper
    if h is None:
        return opts, state.tx
    opts = opts._replace(gamma=h.gamma, gae_lambda=h.gae_lambda, clip_eps=h.clip_eps,
                         ent_coef=h.ent_coef, vf_coef=h.vf_coef)
    return opts, (opts.make_tx(h.lr, h.max_grad_norm) if opts.make_tx else state.tx)


def _active_loop(sgd_step, flat, opt_state, idx, active):
    """Run `sgd_step` on the active minibatches only, in their order: `(flat, opt_state,
    mean metrics)`. A round of `n` of `M` padded shards then costs its own `n` shards'
    steps rather than `M`'s (the padded steps were computed and thrown away); under
    `vmap` the loop runs as long as the longest member's."""
    order = jnp.argsort(~active, stable=True)  # the active steps first, in plan order
    count = active.sum()
    shape = jax.eval_shape(sgd_step, flat, opt_state, idx[0])[2]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)

    def body(k, carry):
        flat, opt_state, sums = carry
        flat, opt_state, metrics = sgd_step(flat, opt_state, idx[order[k]])
        return flat, opt_state, jax.tree.map(jnp.add, sums, metrics)

    flat, opt_state, sums = jax.lax.fori_loop(0, count, body, (flat, opt_state, zeros))
    return flat, opt_state, jax.tree.map(lambda m: m / jnp.maximum(count, 1).astype(m.dtype), sums)


def _scan_loop(sgd_step, flat, opt_state, idx, active, opts: PPOOptions):
    """Every planned minibatch step in a scan (unrolled where `opts.unroll`): `(flat,
    opt_state, mean metrics)`; under `opts.minibatch_size` the inactive ones are
    computed and dropped."""

    def minibatch_step(carry, xs):
        mb_idx, on = xs
        new_flat, new_opt, metrics = sgd_step(*carry, mb_idx)
        if not opts.minibatch_size:  # every step runs: no selects on the hot path
            return (new_flat, new_opt), metrics
        # a skipped step keeps the optimiser's count too, so LR decay follows real steps
        keep = lambda new, old: jnp.where(on, new, old)  # noqa: E731
        return (keep(new_flat, carry[0]), jax.tree.map(keep, new_opt, carry[1])), metrics

    (flat, opt_state), metrics = jax.lax.scan(
        minibatch_step, (flat, opt_state), (idx, active), unroll=True if opts.unroll else 1)
    if not opts.minibatch_size:
        return flat, opt_state, jax.tree.map(jnp.mean, metrics)
    w = active.astype(jnp.float32)
    return flat, opt_state, jax.tree.map(lambda m: (m * w).sum() / jnp.maximum(w.sum(), 1.0), metrics)
