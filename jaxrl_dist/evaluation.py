"""A trained policy from a run directory, and its evaluation (`jaxrl-dist eval`).

`load_policy(run_dir)` reads the run's `config.yaml` and latest checkpoint and
returns a jitted `obs -> action` callable with the run's observation
normalisation applied. Statistics by trainer:

- fused: each seed has its own params and statistics; `seed_index` picks one.
- sync and async (gymnax slots): one set of params; each slot kept its own
  observation statistics, and they are merged as the moments of all the
  observations the slots saw together (count-weighted mean, and the variance
  about that mean: Chan et al.'s parallel combination). Slots that have not run
  yet hold only the prior (count 1e-4), so they barely move the merge.
- sync and async on envpool: the statistics live on the workers, not in the
  checkpoint; a run that normalised observations cannot be loaded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.config import (Config, ConfigError, EvalConfig, derive, needs, on_one_device, require, resolve_auto,
                               typed)
from jaxrl_dist.core import normalize
from jaxrl_dist.core.networks import initial_carry, is_recurrent, make_network, mask_logits
from jaxrl_dist.core.networks import step as step_policy
from jaxrl_dist.core.types import RunningMoments
from jaxrl_dist.envs import env_of
from jaxrl_dist.trainers.checkpoint import CHECKPOINT_SUBDIR, Checkpointer, load_run_config, saved_steps
from jaxrl_dist.trainers.rounds import state_template as shard_template
from jaxrl_dist.trainers.runner import state_template as fused_template

EVAL_FILE = "eval.json"
VIDEO_FILE = "eval.mp4"  # episode 0, with eval.video=true


@dataclasses.dataclass
class Policy:
    """`policy(obs[N, ...], key=None, mask=None, reset=None) -> action[N, ...]`, and what
    it was built from.

    A recurrent policy keeps its hidden state between calls (one per env of the batch,
    started afresh when the batch size changes): `reset()` starts every env's episode
    again, and `reset=[N] bool` in a call restarts those envs' before they act. `mask`
    (`[N, A]` bool) are the legal actions of an env that gives them; the policy never
    picks another."""

    act: Any  # jitted `(params, carry, obs, key, mask, reset) -> (carry, action)`
    config: Config
    spec: Any
    params: Any
    obs_moments: Optional[RunningMoments]  # None: the run did not normalise observations
    step: int  # the checkpoint's update (fused) or round (sync, async) counter
    network: Any = None
    carry: Any = None  # recurrent: the hidden state of the last call's envs
    key: Any = None  # a sampling policy's own stream, for calls without a key (split at each)

    @property
    def recurrent(self) -> bool:
        return is_recurrent(self.network)

    def __repr__(self) -> str:  # the params and moments are arrays: hundreds of lines
        s = self.spec
        return (f"Policy({s.env_id}, obs {tuple(s.obs_shape)}, {s.num_actions} "
                f"{'actions' if s.discrete else 'action dims'}, {self.config.algo.network} network"
                f"{' (recurrent)' * self.recurrent}, step {self.step})")

    def reset(self) -> None:
        """Forget the hidden state: the next call starts every env's episode."""
        self.carry = None

    def __call__(self, obs, key=None, mask=None, reset=None):
        obs = jnp.asarray(obs)
        require(obs.shape[1:] == tuple(self.spec.obs_shape), f"policy: observations of shape {tuple(obs.shape)}; "
                f"this policy takes [N, {', '.join(map(str, self.spec.obs_shape))}] ({self.spec.env_id})")
        n = obs.shape[0]
        fresh = self.carry is None or jax.tree.leaves(self.carry)[0].shape[0] != n
        if self.recurrent and fresh:
            self.carry, reset = initial_carry(self.network, n), jnp.ones((n,), bool)
        reset = jnp.zeros((n,), bool) if reset is None else jnp.asarray(reset, bool)
        if key is None:  # a new sample each call, as with a key of the caller's
            self.key, key = jax.random.split(jax.random.PRNGKey(0) if self.key is None else self.key)
        mask = None if mask is None else jnp.asarray(mask, bool)
        self.carry, action = self.act(self.params, self.carry, obs, key, mask, reset)
        return action


def saved_state(cfg: Config, run_dir) -> tuple:
    """`(step, state)`: the run's latest checkpoint, restored by its checkpointer into the
    trainer's own state type (`RunnerState` for fused, `ShardState` for sync and async),
    on one device: a data-parallel run's state was saved sharded over devices this
    process may not have."""
    none = f"{run_dir}: no checkpoint in {Path(run_dir).resolve() / CHECKPOINT_SUBDIR}"
    # a loss shapes no state: reading a run's checkpoint needs its network plugin, not its loss plugin
    cfg = dataclasses.replace(on_one_device(cfg), algo=dataclasses.replace(cfg.algo, loss="ppo", loss_options={}))
    require(bool(saved_steps(run_dir)), none)  # before orbax starts its threads, which a quick exit would cut short
    ckpt = Checkpointer(Path(run_dir), read_only=True)
    try:
        step = ckpt.latest_step()
        require(step is not None, none)  # a step directory orbax does not count
        if cfg.trainer.name == "fused":
            env = env_of(cfg.env, cfg.env.num_envs * cfg.num_seeds, cfg.seed)
            template = fused_template(cfg, env)
        else:
            template = shard_template(cfg)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        on_one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), template)
        try:
            return step, ckpt.restore(on_one, step)
        except (ValueError, TypeError, KeyError) as e:  # orbax: a tree or shape that is not the config's
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"{run_dir}: checkpoint {step} does not match the run's config "
                              f"(trainer={cfg.trainer.name}, num_seeds={cfg.num_seeds}): {first}") from None
    finally:
        ckpt.close()


def latest_state(run_dir) -> tuple:
    """`saved_state` of a run directory, with the config it was started with."""
    return saved_state(load_run_config(Path(run_dir), "eval"), run_dir)


def merge_moments(mean, var, count) -> RunningMoments:
    """One set of moments from stacked ones (`[K, ...]` means and variances, `[K]` counts)."""
    count = np.asarray(count, np.float64).reshape(-1)
    mean, var = np.asarray(mean, np.float64), np.asarray(var, np.float64)
    w = (count / count.sum()).reshape((-1,) + (1,) * (mean.ndim - 1))
    total_mean = (w * mean).sum(0)
    total_var = (w * (var + (mean - total_mean) ** 2)).sum(0)
    return RunningMoments(jnp.asarray(total_mean, jnp.float32), jnp.asarray(total_var, jnp.float32),
                          jnp.asarray(count.sum(), jnp.float32))


def _params_and_moments(cfg: Config, state, seed_index: int) -> tuple:
    """The params and observation moments of one policy from a trainer's restored state."""
    params = state.train.params
    if cfg.trainer.name == "fused":
        if not 0 <= seed_index < cfg.num_seeds:
            raise ConfigError(f"seed_index: {seed_index} is not one of the run's {cfg.num_seeds} seeds")
        pick = lambda x: jnp.asarray(x)[seed_index]  # noqa: E731
        return jax.tree.map(pick, params), jax.tree.map(pick, state.actor.norm.obs)
    if state.table is None:
        return params, None  # sticky (envpool) slots: statistics stay on the workers
    m = state.table.norm.obs  # `[M, 1, ...]`: one set per slot
    flat = lambda x: np.asarray(x).reshape((-1,) + np.asarray(x).shape[2:])  # noqa: E731
    return params, merge_moments(flat(m.mean), flat(m.var), np.asarray(m.count).reshape(-1))


def _act_fn(network, spec, moments, clip_obs: float, deterministic: bool):
    def act(params, carry, obs, key, mask, reset):
        if moments is not None:
            obs = normalize.normalize(moments, obs, clip_obs)
        carry, out = step_policy(network, params, carry, obs, reset)
        out = mask_logits(out, mask)
        if spec.discrete:
            pick = jnp.argmax(out.logits, -1) if deterministic else jax.random.categorical(key, out.logits)
            return carry, pick
        action = out.logits
        if not deterministic:
            action = action + jnp.exp(out.log_std) * jax.random.normal(key, action.shape, action.dtype)
        return carry, jnp.clip(action, spec.action_low, spec.action_high)

    return jax.jit(act)


def load_policy(run_dir, deterministic: bool = True, seed_index: int = 0) -> Policy:
    """The run's latest policy as a `Policy`: `policy(obs[N, ...]) -> action[N, ...]`.

    `deterministic`: the most likely action (argmax, or the Gaussian mean clipped to
    the action bounds); else a sample: pass `key`, or the policy draws from its own
    stream (seeded 0), a new sample each call. See the module doc for which
    observation statistics are applied.
    """
    cfg = load_run_config(Path(run_dir), "load_policy")
    env = env_of(cfg.env, 1, cfg.seed)
    spec = env.spec
    a = cfg.algo
    network = make_network(spec, a.network, a.hidden_sizes, a.activation, a.network_options)
    step, state = saved_state(cfg, run_dir)
    params, moments = _params_and_moments(cfg, state, seed_index)
    normalise = derive(cfg, continuous=not spec.discrete).normalize_obs
    if normalise and moments is None:
        raise ConfigError(f"{run_dir}: its observation statistics stayed on the envpool workers "
                          "(trainer=sync/async); only a fused run of this env can be loaded")
    moments = moments if normalise else None
    fn = _act_fn(network, spec, moments, cfg.env.clip_obs, deterministic)
    return Policy(fn, cfg, spec, jax.tree.map(jnp.asarray, params), moments, step, network)


def _episode_step(env, policy: Policy, masked: bool):
    """One jitted step of the env batch under the policy: `(state, obs, mask, carry, ...)`."""

    def step(params, carry, state, obs, mask, key):
        act_key, env_key = jax.random.split(key)
        reset = jnp.zeros((obs.shape[0],), bool)
        carry, action = policy.act(params, carry, obs, act_key, mask, reset)
        state, out = env.step(state, action, env_key)
        mask = out.action_mask if masked else None
        return state, out.obs, mask, carry, out.log_reward, out.valid, out.episode_end

    return jax.jit(step)


def masks_actions(cfg: Config, spec) -> bool:
    """Whether a run of `cfg` sampled only the legal actions of its env."""
    return spec.masked and resolve_auto(cfg.algo.action_mask, "algo.action_mask", True)


def run_episodes(env, policy: Policy, seed: int, max_steps: int, record: bool = False) -> tuple:
    """One episode in each of `env.num_envs` envs side by side: `(returns, lengths, frames)`,
    NaN and the step count where an episode had not ended after `max_steps` steps.
    `record`: `frames` holds a picture of env 0 in each state it acted in, through its
    episode (`env.frame`), else it is empty."""
    n = env.num_envs
    key, reset_key = jax.random.split(jax.random.PRNGKey(seed))
    state, obs = env.reset(reset_key)
    masked = masks_actions(policy.config, env.spec)
    mask = env.action_mask(state) if masked else None
    carry = initial_carry(policy.network, n)  # each env plays one episode from a fresh carry
    step = _episode_step(env, policy, masked)
    ret, length = np.zeros(n), np.zeros(n, np.int64)
    done_ret, done_len, finished = np.full(n, np.nan), np.zeros(n, np.int64), np.zeros(n, bool)
    frames = []
    for t in range(max_steps):
        if record and not finished[0]:
            frames.append(env.frame(state, 0, obs))
        key, sub = jax.random.split(key)
        state, obs, mask, carry, reward, valid, end = step(policy.params, carry, state, obs, mask, sub)
        valid, end = np.asarray(valid), np.asarray(end) & ~finished
        ret += np.where(valid, np.asarray(reward), 0.0)
        length += valid
        done_ret[end], done_len[end] = ret[end], length[end]
        finished |= end
        if finished.all():
            break
    done_len[~finished] = length[~finished]
    return done_ret, done_len, frames


def write_video(frames: list, path: Path, fps: int) -> Path:
    """An MP4 (H.264) of RGB frames, through imageio's ffmpeg (the `video` extra)."""
    imageio = needs("imageio.v2", "video", "eval.video=true")
    # macro_block_size=2: keep the frame size (H.264 needs it even), no rescaling
    with _ffmpeg_without_preexec():
        imageio.mimwrite(path, [f[: f.shape[0] // 2 * 2, : f.shape[1] // 2 * 2] for f in frames], fps=fps,
                         codec="libx264", macro_block_size=2, pixelformat="yuv420p")
    return path


# imageio-ffmpeg's switch that drops its `preexec_fn=os.setpgrp` (which keeps Ctrl-C from
# reaching ffmpeg)
_NO_PREEXEC = "IMAGEIO_FFMPEG_NO_PREVENT_SIGINT"


@contextlib.contextmanager
def _ffmpeg_without_preexec():
    """Start ffmpeg without a `preexec_fn`: with one, CPython forks this multithreaded
    process and runs Python in the child (JAX warns that it can deadlock); without one,
    the child only execs ffmpeg and no fork handler runs. A value the user set is kept."""
    before = os.environ.get(_NO_PREEXEC)
    if before is None:
        os.environ[_NO_PREEXEC] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_NO_PREEXEC, None)


class EvalResult(NamedTuple):
    """What `jaxrl-dist eval` measured (`eval.json`); an episode still running after
    `max_steps` has a null return and counts in `episodes`, not `episodes_ended`."""

    env_id: str
    checkpoint_step: int
    episodes: int
    deterministic: bool
    seed: int
    seed_index: int
    mean_return: Optional[float]  # over the episodes that ended
    std_return: Optional[float]
    episodes_ended: int
    returns: list
    lengths: list
    video: Optional[str] = None  # the MP4's path, with `eval.video=true`
    video_frames: Optional[int] = None

    def to_json(self) -> dict:
        return {k: v for k, v in self._asdict().items() if v is not None or not k.startswith("video")}


def evaluate(run_dir, opts=None) -> dict:
    """Evaluate the run's policy over `opts.episodes` episodes (an `EvalConfig`, or a
    mapping of its keys; None: its defaults); writes and returns `RUN_DIR/eval.json`."""
    # its types and ranges checked as the CLI's are (episodes=0 was a modulo by zero in a reshape)
    opts = typed(EvalConfig, dataclasses.asdict(opts) if isinstance(opts, EvalConfig) else opts or {}, "eval.")
    opts.check()
    saved = load_run_config(Path(run_dir), "eval")
    if saved.trainer.name == "fused" and not 0 <= opts.seed_index < saved.num_seeds:  # named as typed
        raise ConfigError(f"eval.seed_index: {opts.seed_index} is not one of the run's {saved.num_seeds} seeds")
    policy = load_policy(run_dir, opts.deterministic, opts.seed_index)
    cfg = policy.config
    env = env_of(cfg.env, opts.episodes, opts.seed)
    if opts.video and not hasattr(env, "frame"):
        raise ConfigError(f"eval.video: the {cfg.env.suite} env {cfg.env.id} cannot render")
    if opts.video:  # before the episodes, not after them
        needs("imageio_ffmpeg", "video", "eval.video=true")
    returns, lengths, frames = run_episodes(env, policy, opts.seed, opts.max_steps, opts.video)
    ended = ~np.isnan(returns)
    result = EvalResult(
        env_id=cfg.env.id, checkpoint_step=policy.step, episodes=int(opts.episodes),
        deterministic=bool(opts.deterministic), seed=int(opts.seed), seed_index=int(opts.seed_index),
        mean_return=float(returns[ended].mean()) if ended.any() else None,
        std_return=float(returns[ended].std()) if ended.any() else None, episodes_ended=int(ended.sum()),
        returns=[None if math.isnan(r) else float(r) for r in returns], lengths=[int(x) for x in lengths])
    if opts.video:
        result = result._replace(video=str(write_video(frames, Path(run_dir) / VIDEO_FILE, opts.video_fps)),
                                 video_frames=len(frames))
    result = result.to_json()
    (Path(run_dir) / EVAL_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result
