"""The whole FTW training program as one compiled function: rollouts → pool → updates → evaluation.

    trainer = make_train(TrainConfig.for_env("cartpole"))
    carry, (metrics, evaluation) = trainer.train(key)          # one jit, one lax.scan over everything
    carries = jax.vmap(trainer.init)(keys)                      # seeds: vmap outside
    carries, history = trainer.run(carries, num_periods=2)      # or in chunks, to report progress

The program is a scan over evaluation periods, each a scan over `eval_every` iterations followed by an
evaluation; the PRNG key lives in the carry, so running it in chunks gives exactly the result of one scan.
One iteration: B episodes rolled out in parallel (vmap) with the current policy → added to the pool →
U FTW updates (or, for a baseline, `config.algorithm`, its updates on those B episodes; PPO's critic lives
in the carry beside the policy).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from ftw_jax import envs, probes
from ftw_jax import pool as pool_lib
from ftw_jax.checks import check_positive_int
from ftw_jax.envs.base import WithLegalActions
from ftw_jax.policy_gradient import (ALGORITHMS, PolicyGradientConfig, batch_advantages, create_critic,
                                     make_critic_update, make_policy_gradient_update, ppo_advantages)
from ftw_jax.policies import ConvPolicy, MLPPolicy, TabularPolicy, TransformerPolicy
from ftw_jax.rollout import rollout, rollouts
from ftw_jax.update import FTWState, UpdateConfig, make_update

# Per environment, the defaults that train in seconds to minutes on 2 CPU cores.
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "bandit": dict(
        num_iterations=240, episodes_per_iteration=1, pool_capacity=128, num_batches=4, batch_size=5,
        num_elites=1, optimizer="sgd", learning_rate=0.08, kl_coef=0.05, eval_every=24, eval_episodes=64,
    ),
    "cartpole": {},  # the TrainConfig defaults
    "sokoban": dict(
        num_iterations=300, episodes_per_iteration=64, pool_capacity=512, num_batches=128, batch_size=4,
        num_elites=1, optimizer="adam", learning_rate=3e-3, kl_coef=0.0, eval_every=20, eval_episodes=256,
        updates_per_iteration=4, policy="conv", conv_channels=(16, 16), hidden_sizes=(128,),
    ),
    "search": dict(
        num_iterations=400, episodes_per_iteration=128, pool_capacity=512, num_batches=32, batch_size=32,
        num_elites=1, optimizer="adam", learning_rate=3e-3, kl_coef=0.5, kl_coef_final=0.0, eval_every=40,
        eval_episodes=256, updates_per_iteration=4,
    ),
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything static about a training run; validated on construction. See `for_env` for defaults."""

    env: str = "cartpole"
    num_iterations: int = 120
    episodes_per_iteration: int = 16  # B
    updates_per_iteration: int = 1  # U
    pool_capacity: int = 64  # N
    num_batches: int = 16  # J
    batch_size: int = 8  # C
    num_elites: int = 2  # K
    optimizer: str = "adam"  # "adam" or "sgd"
    learning_rate: float = 3e-3
    kl_coef: float = 0.0  # β at the start
    kl_coef_final: float | None = None  # β decays linearly to this by the last iteration; None: constant
    hidden_sizes: tuple[int, ...] = (64, 64)
    policy: str = "mlp"  # "mlp", or "conv" for grid observations [H, W, C] (bandit: tabular; search: transformer)
    conv_channels: tuple[int, ...] = (16, 16)
    eval_every: int = 10
    eval_episodes: int = 32
    normalisation: str = "token"
    reference: str = "initial"
    kl_direction: str = "policy_to_reference"
    elite_rule: str = "top_k"  # or "beat_minimum": keep only elites above their minibatch's lowest return
    # Mixed policy versions (UpdateConfig): eviction by age, truncated importance weights, the monitors.
    max_staleness: int | None = None  # V: leave out entries played more than V versions ago
    importance_weight_cap: float | None = None  # c: weight kept trajectories by min(π_θ(τ)/q(τ), c)
    monitor_entries: int = 16  # pool entries on which each update's KL(π_old ‖ π_new) is measured; 0: off
    monitor_discount: float = 0.99  # γ of the logged TRPO penalty term
    staleness_histogram_bins: int = 0  # > 0: log the pool's staleness histogram every iteration
    # Probe-based task filtering (ftw_jax.probes): at the start of every evaluation period, M candidate tasks
    # get n probes each with the current policy, and the period trains on those solved 0 < s < n times.
    probe_tasks: int = 0  # M; 0: no filtering
    probes_per_task: int = 4  # n
    # "ftw", or a baseline on the same rollouts (ftw_jax.policy_gradient): "reinforce", "grpo", "ppo".
    algorithm: str = "ftw"
    group_size: int = 8  # GRPO: G episodes per start state (B a multiple of G)
    normalise_advantages: bool = True  # GRPO: divide advantages by the group's sd
    clip_epsilon: float = 0.2  # GRPO and PPO
    discount: float = 1.0  # PPO: γ
    gae_lambda: float = 0.95  # PPO: λ

    @classmethod
    def for_env(cls, env: str, **overrides) -> "TrainConfig":
        if env not in ENV_DEFAULTS:
            raise ValueError(f"unknown environment {env!r}; expected one of {sorted(ENV_DEFAULTS)}.")
        return cls(env=env, **{**ENV_DEFAULTS[env], **overrides})

    def __post_init__(self):
        for name in ("num_iterations", "episodes_per_iteration", "updates_per_iteration", "eval_every", "eval_episodes"):
            check_positive_int(name, getattr(self, name))
        if self.num_iterations % self.eval_every:
            raise ValueError(
                f"num_iterations ({self.num_iterations}) must be a multiple of eval_every ({self.eval_every})."
            )
        if self.episodes_per_iteration > self.pool_capacity:
            raise ValueError(
                f"episodes_per_iteration (B={self.episodes_per_iteration}) must be <= pool_capacity "
                f"(N={self.pool_capacity})."
            )
        if self.policy not in ("mlp", "conv"):
            raise ValueError(f"policy must be 'mlp' or 'conv', got {self.policy!r}.")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}.")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef!r}.")
        if self.kl_coef_final is not None and not self.kl_coef_final >= 0:
            raise ValueError(f"kl_coef_final must be >= 0 or None, got {self.kl_coef_final!r}.")
        self.update_config  # validates N, J, C, K and the update options
        if not (isinstance(self.probe_tasks, int) and self.probe_tasks >= 0):
            raise ValueError(f"probe_tasks must be an int >= 0, got {self.probe_tasks!r}.")
        if not (isinstance(self.probes_per_task, int) and self.probes_per_task >= 2):
            raise ValueError(f"probes_per_task must be an int >= 2 (one probe cannot tell), got {self.probes_per_task!r}.")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}.")
        if self.algorithm != "ftw":
            self.policy_gradient_config  # validates the baseline's options
            if self.algorithm == "grpo" and self.episodes_per_iteration % self.group_size:
                raise ValueError(f"episodes_per_iteration (B={self.episodes_per_iteration}) must be a multiple of "
                                 f"group_size (G={self.group_size}) for GRPO.")

    @property
    def update_config(self) -> UpdateConfig:
        return UpdateConfig(
            pool_capacity=self.pool_capacity,
            num_batches=self.num_batches,
            batch_size=self.batch_size,
            num_elites=self.num_elites,
            normalisation=self.normalisation,
            reference=self.reference,
            kl_direction=self.kl_direction,
            elite_rule=self.elite_rule,
            max_staleness=self.max_staleness,
            importance_weight_cap=self.importance_weight_cap,
            monitor_entries=self.monitor_entries,
            monitor_discount=self.monitor_discount,
            staleness_histogram_bins=self.staleness_histogram_bins,
        )

    @property
    def policy_gradient_config(self) -> PolicyGradientConfig:
        return PolicyGradientConfig(algorithm=self.algorithm, group_size=self.group_size,
                                    normalise_advantages=self.normalise_advantages, clip_epsilon=self.clip_epsilon,
                                    discount=self.discount, gae_lambda=self.gae_lambda)

    @property
    def num_periods(self) -> int:
        return self.num_iterations // self.eval_every

    def hyperparameters(self) -> Hyperparameters:
        """The config's own sizes, β and learning rate as arrays."""
        return Hyperparameters(
            sizes=jnp.array([self.num_batches, self.batch_size, self.num_elites], jnp.int32),
            kl_coef=jnp.asarray(self.kl_coef, jnp.float32),
            learning_rate=jnp.asarray(self.learning_rate, jnp.float32),
            pool_capacity=jnp.asarray(self.pool_capacity, jnp.int32),
        )


@flax.struct.dataclass
class Hyperparameters:
    """What may differ between the members of one compiled program (a sweep vmaps over these).

    The sizes live inside the config's, which act as maxima (`select_elites_masked`, `pool.init`'s
    `slots_in_use`).
    """

    sizes: jax.Array  # [3] int32: J, C, K
    kl_coef: jax.Array  # [] float32: β at the start (it decays to `kl_coef_final` if that is set)
    learning_rate: jax.Array  # [] float32
    pool_capacity: jax.Array  # [] int32: N, the pool's slots in use


@flax.struct.dataclass
class TrainCarry:
    """What one seed's program carries from iteration to iteration."""

    state: FTWState
    pool: pool_lib.Pool
    key: jax.Array
    iteration: jax.Array  # [] int32
    env_steps: jax.Array  # [] int32: training env steps so far (evaluation not counted)
    hyperparameters: Hyperparameters
    critic: Any = None  # PPO: the critic's params and optimizer state (a flax TrainState)


@dataclasses.dataclass(frozen=True)
class Trainer:
    """`init(key[, hyperparameters]) -> carry`; `run(carry, num_periods) -> (carry, (metrics, evaluation))`.

    `metrics` leaves are [periods, eval_every] (per iteration), `evaluation` leaves [periods].
    `run` is jitted with `num_periods` static; vmap `init` and `run` over seeds (and hyperparameters).
    """

    config: TrainConfig
    env: envs.Environment
    policy: Any
    init: Any
    run: Any

    def train(self, key: jax.Array, hyperparameters: Hyperparameters | None = None):
        return self.run(self.init(key, hyperparameters), self.config.num_periods)


def make_policy(config: TrainConfig, env: envs.Environment, num_outputs: int | None = None):
    """The env's policy network; with `num_outputs` (1 for a critic) the same architecture with that many outputs."""
    num_actions = num_outputs or env.num_actions
    if config.env == "bandit":
        return TabularPolicy(num_actions=num_actions)
    if config.env == "search":
        return TransformerPolicy(num_actions=num_actions, vocabulary_size=env.vocabulary_size, max_length=env.max_steps)
    if config.policy == "conv":
        return ConvPolicy(num_actions=num_actions, channels=config.conv_channels, hidden_sizes=config.hidden_sizes)
    return MLPPolicy(num_actions=num_actions, hidden_sizes=config.hidden_sizes)


def without_legal_actions(observation):
    """A critic reads the observation only (legal-action masks shape logits, not values)."""
    return observation.observation if isinstance(observation, WithLegalActions) else observation


def make_train(config: TrainConfig, **env_options) -> Trainer:
    """Builds the training program for `config` (env options go to `ftw_jax.envs.make`)."""
    env = envs.make(config.env, **env_options)
    if config.probe_tasks and not env.has_success:
        raise ValueError(f"probe_tasks needs an environment with a notion of success; {config.env} has none.")
    env_params = env.default_params()
    eval_params = env.evaluation_params(env_params)
    policy = make_policy(config, env)
    update = make_update(policy.apply, config.update_config)
    if config.algorithm != "ftw":
        policy_gradient_update = make_policy_gradient_update(policy.apply, config.policy_gradient_config)
    if config.algorithm == "ppo":
        critic_network = make_policy(config, env, num_outputs=1)
        value_fn = lambda params, observation: critic_network.apply(  # noqa: E731
            params, without_legal_actions(observation))[:, 0]
        critic_update = make_critic_update(value_fn)
    # The learning rate is a state array (optax.inject_hyperparams), so members of a sweep can differ in it.
    optimizer = optax.inject_hyperparams(optax.adam if config.optimizer == "adam" else optax.sgd)(
        learning_rate=config.learning_rate
    )

    def with_learning_rate(opt_state, learning_rate):
        opt_state.hyperparams["learning_rate"] = jnp.asarray(learning_rate, jnp.float32)
        return opt_state

    def play(key, params, version, num_episodes, env_params=env_params, group_size=1, reset_keys=None):
        """(trajectories [B, T, ...], success [B]) of B episodes with the current policy."""
        return rollouts(key, env, env_params, policy, params, version, num_episodes, group_size, reset_keys)

    def init(key: jax.Array, hyperparameters: Hyperparameters | None = None) -> TrainCarry:
        if hyperparameters is None:
            hyperparameters = config.hyperparameters()
        params_key, example_key, key = jax.random.split(key, 3)
        observation, _ = env.reset(example_key, env_params)
        observation = jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], observation)
        critic = None
        if config.algorithm == "ppo":  # split only here: the other algorithms' random streams stay as they were
            params_key, critic_key = jax.random.split(params_key)
            critic = create_critic(critic_network.init(critic_key, without_legal_actions(observation)), optimizer)
            critic = critic.replace(opt_state=with_learning_rate(critic.opt_state, hyperparameters.learning_rate))
        params = policy.init(params_key, observation)
        example, _ = jax.eval_shape(
            lambda k: rollout(k, env, env_params, policy, params, jnp.zeros((), jnp.int32)), jax.random.key(0)
        )
        example = jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), example)
        state = FTWState.create(params, optimizer, kl_coef=hyperparameters.kl_coef)
        return TrainCarry(
            state=state.replace(opt_state=with_learning_rate(state.opt_state, hyperparameters.learning_rate)),
            pool=pool_lib.init(config.pool_capacity, example, slots_in_use=hyperparameters.pool_capacity),
            key=key,
            iteration=jnp.zeros((), jnp.int32),
            env_steps=jnp.zeros((), jnp.int32),
            hyperparameters=hyperparameters,
            critic=critic,
        )

    def kl_coef_at(carry: TrainCarry) -> jax.Array:
        """β for this iteration: linear from the member's start value to `kl_coef_final` at the last one."""
        progress = carry.iteration / max(config.num_iterations - 1, 1)
        start = carry.hyperparameters.kl_coef
        return ((start - config.kl_coef_final) * (1 - progress) + config.kl_coef_final).astype(jnp.float32)

    def learn(carry: TrainCarry, state: FTWState, batch, update_key):
        """(carry with the new state, pool and critic, metrics of every update) after learning from the batch."""
        if config.algorithm == "ppo":  # U epochs on the batch, each a policy step and a critic step
            advantages, targets = ppo_advantages(config.policy_gradient_config, value_fn, carry.critic.params, batch)

            def epoch(states, _):
                state, metrics = policy_gradient_update(states[0], batch, advantages)
                critic, value_loss = critic_update(states[1], batch, targets)
                return (state, critic), {**metrics, "value_loss": value_loss}

            (state, critic), metrics = jax.lax.scan(epoch, (state, carry.critic), None,
                                                    length=config.updates_per_iteration)
            return carry.replace(state=state, critic=critic), metrics
        if config.algorithm != "ftw":  # no pool; REINFORCE one step, GRPO U steps on the batch
            advantages = batch_advantages(config.policy_gradient_config, batch.episode_return)
            steps = 1 if config.algorithm == "reinforce" else config.updates_per_iteration
            state, metrics = jax.lax.scan(lambda state, _: policy_gradient_update(state, batch, advantages),
                                          state, None, length=steps)
            return carry.replace(state=state), metrics
        pool = pool_lib.add(carry.pool, batch)
        sizes = carry.hyperparameters.sizes
        state, metrics = jax.lax.scan(
            lambda state, k: update(state, pool, k, sizes), state,
            jax.random.split(update_key, config.updates_per_iteration),
        )
        return carry.replace(state=state, pool=pool), metrics

    def iteration(carry: TrainCarry, tasks):
        key, play_key, update_key = jax.random.split(carry.key, 3)
        group_size = config.group_size if config.algorithm == "grpo" else 1
        reset_keys = None
        if tasks is not None:  # start states from the kept tasks (a GRPO group shares one)
            play_key, task_key = jax.random.split(play_key)
            groups = probes.draw_tasks(task_key, *tasks, config.episodes_per_iteration // group_size)
            reset_keys = jnp.repeat(groups, group_size, axis=0)
        batch, success = play(play_key, carry.state.params, carry.state.version, config.episodes_per_iteration,
                              group_size=group_size, reset_keys=reset_keys)
        state = carry.state
        if config.kl_coef_final is not None:
            state = state.replace(kl_coef=kl_coef_at(carry))
        learned, update_metrics = learn(carry, state, batch, update_key)
        state = learned.state
        returns = batch.episode_return
        env_steps = carry.env_steps + jnp.sum(batch.mask, dtype=jnp.int32)
        metrics = {
            **jax.tree.map(lambda m: m[-1], update_metrics),  # the iteration's last update
            "return_mean": jnp.mean(returns),
            "return_max": jnp.max(returns),
            "return_min": jnp.min(returns),
            "success": jnp.mean(success),
            "env_steps": env_steps,
            "kl_coef": state.kl_coef,
        }
        new_carry = learned.replace(key=key, iteration=carry.iteration + 1, env_steps=env_steps)
        return new_carry, metrics

    def filtered_tasks(carry: TrainCarry):
        """(carry with the probes' key and env steps spent, (task keys [M], kept [M]))."""
        key, candidates_key, probe_key = jax.random.split(carry.key, 3)
        task_keys = jax.random.split(candidates_key, config.probe_tasks)
        successes, probe_steps = probes.probe(probe_key, env, env_params, policy, carry.state.params,
                                              carry.state.version, task_keys, config.probes_per_task)
        kept = probes.keep_informative(successes, config.probes_per_task)
        return carry.replace(key=key, env_steps=carry.env_steps + probe_steps), (task_keys, kept)

    def period(carry: TrainCarry, _):
        tasks, filtering = None, {}
        if config.probe_tasks:
            steps_before = carry.env_steps
            carry, tasks = filtered_tasks(carry)
            filtering = {"informative_tasks": jnp.mean(tasks[1]), "probe_env_steps": carry.env_steps - steps_before}
        carry, metrics = jax.lax.scan(lambda carry, _: iteration(carry, tasks), carry, None, length=config.eval_every)
        key, eval_key = jax.random.split(carry.key)
        episodes, success = play(eval_key, carry.state.params, carry.state.version, config.eval_episodes, eval_params)
        evaluation = {
            "return": jnp.mean(episodes.episode_return),
            "success": jnp.mean(success),
            "iteration": carry.iteration,
            "env_steps": carry.env_steps,  # probes included
            **filtering,
        }
        return carry.replace(key=key), (metrics, evaluation)

    @functools.partial(jax.jit, static_argnums=1)
    def run(carry: TrainCarry, num_periods: int):
        return jax.lax.scan(period, carry, None, length=num_periods)

    return Trainer(config=config, env=env, policy=policy, init=init, run=run)
