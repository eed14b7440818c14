"""The whole training program as one compiled function: rollouts → learner → evaluation.

    trainer = make_train(TrainConfig.for_env("cartpole"))
    carry, (metrics, evaluation) = trainer.train(key)          # one jit, one lax.scan over everything
    carries = jax.vmap(trainer.init)(keys)                      # seeds: vmap outside
    carries, history = trainer.run(carries, num_periods=2)      # or in chunks, to report progress

The program is a scan over evaluation periods, each a scan over `eval_every` iterations followed by an
evaluation; the PRNG key lives in the carry, so running it in chunks gives exactly the result of one scan.
One iteration: B episodes rolled out in parallel (vmap) with the current policy → the algorithm's `learn`
(`ftw_jax.algos`: FTW puts them in its pool and runs U updates; a baseline learns from the batch).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import flax.struct
import jax
import jax.numpy as jnp

from ftw_jax import algos, envs
from ftw_jax.algos import defaults
from ftw_jax.algos.base import Context, Hyperparameters, Learner, with_learning_rate
from ftw_jax.algos.learner_settings import LearnerSettings, make_optimizer
from ftw_jax.core.checks import check_positive_int
from ftw_jax.core.settings import check_settings, check_takes_effect, setting
from ftw_jax.lab import probes, warm_start
from ftw_jax.lab.rollout import Player, rollout, rollouts
from ftw_jax.policies import ARCHITECTURES, FROM_CHECKPOINT
from ftw_jax.policies.base import PolicyNetwork
from ftw_jax.running import skips
from ftw_jax.running.memory import check_state_memory, state_bytes

if TYPE_CHECKING:
    from ftw_jax.core.pool import Trajectory
    from ftw_jax.lm.load import Pretrained
    from ftw_jax.policies.lm import LMPolicy


@dataclasses.dataclass(frozen=True)
class TrainConfig(LearnerSettings):
    """Everything static about a training run; validated on construction. See `for_env` for defaults.

    The run's own settings are fields here; the algorithm's are its config (`algorithm_config`, an instance
    of `algos.ALGORITHMS[algorithm].config`; None: its defaults), the environment's options go to
    `make_train`.
    """

    env: str = "cartpole"
    algorithm: str = setting(
        defaults.DEFAULT_ALGORITHM, "ftw, or a baseline on the same rollouts", choices=lambda: tuple(algos.ALGORITHMS)
    )
    num_iterations: int = setting(120, "training iterations (a multiple of `eval_every`)", flag="iterations")
    kl_coef_final: float | None = setting(None, "beta decays linearly to this by the last iteration (None: constant)")
    kl_decay_iterations: int | None = setting(
        None, "beta reaches kl_coef_final after this many iterations and stays there (None: at the last one)"
    )
    anneal_learning_rate: bool = setting(
        False,
        "decay the learning rate linearly, lr·(1 − i/iterations) at iteration i, for every algorithm "
        "(CleanRL's PPO schedule)",
    )
    policy: str | None = setting(
        None,
        "the policy network (default: the environment's; sokoban: conv or mlp)",
        choices=lambda: tuple(ARCHITECTURES),
    )
    model: str | None = setting(
        None,
        "a Hugging Face Llama/Qwen2 folder (config.json, safetensors weights, tokenizer.json): the policy starts "
        "from its weights and the task is written in its tokens and chat template (text-search, policy lm; "
        "None: a fresh policy over the task's own words); its longer episodes need a larger step_limit",
    )
    hidden_sizes: tuple[int, ...] = setting((64, 64), "hidden layer widths of the MLP (and the conv policy's head)")
    conv_channels: tuple[int, ...] = setting((16, 16), "the conv policy's channels")
    eval_every: int = setting(10, "iterations between evaluations")
    eval_episodes: int = setting(32, "episodes per evaluation")
    eval_greedy: bool = setting(
        False,
        "also evaluate the most likely actions (greedy_return, greedy_success) beside the sampled policy's, on "
        "the same number of episodes",
    )
    # Probe-based task filtering (ftw_jax.lab.probes): at the start of every evaluation period, M candidate tasks
    # get n probes each with the current policy, and the period trains on those solved 0 < s < n times.
    probe_tasks: int = setting(0, "task filtering: M candidate tasks probed each period (0: off)")
    probes_per_task: int = setting(4, "task filtering: n probes per task; kept if 0 < successes < n")
    # A supervised warm start (ftw_jax.lab.warm_start), as LLM-agent pipelines fine-tune on demonstrations before RL.
    warm_start_demonstrations: int = setting(
        0,
        "warm start: fit the fresh policy to this many of the environment's demonstrations before training, and "
        "take it as the KL's reference (0: off)",
    )
    warm_start_steps: int = setting(300, "warm start: Adam steps on the demonstrations' cross-entropy")
    warm_start_learning_rate: float = setting(1e-3, "warm start: Adam's learning rate")
    algorithm_config: Any = None

    @classmethod
    def for_env(
        cls, env: str, *, on_other_algorithms: Callable[[dict], None] | None = None, **overrides: Any
    ) -> TrainConfig:
        """The defaults of this environment and algorithm (`ftw_jax.algos.defaults`) with `overrides`, each a field
        of this class or of the algorithm's config. A field of another algorithm's config is refused, or left out
        and handed to `on_other_algorithms` (the command line's note) where that is given."""
        algorithm = algos.get(overrides.get("algorithm", defaults.DEFAULT_ALGORITHM))
        run, own, others = algos.split_settings(algorithm.name, overrides, RUN_FIELDS)
        if others and on_other_algorithms is None:
            raise ValueError(f"{', '.join(sorted(others))} do(es) not apply to {algorithm.name}.")
        if others and on_other_algorithms is not None:
            on_other_algorithms(others)
        envs.entry(env)  # refuses an unknown environment
        settings = {**defaults.of(env, algorithm.name), **run, **own}
        in_run = {name for name in settings if name in RUN_FIELDS}
        config = algorithm.config(**{name: value for name, value in settings.items() if name not in in_run})
        return cls(env=env, **{name: settings[name] for name in in_run}, algorithm_config=config)

    def __post_init__(self):
        algorithm = algos.get(self.algorithm)
        object.__setattr__(self, "algorithm_config", algos.config_of(self.algorithm, self.algorithm_config))
        entry = envs.entry(self.env)
        if self.policy is None:
            object.__setattr__(self, "policy", entry.policies[0])
        if self.policy not in entry.policies:
            raise ValueError(f"policy must be one of {entry.policies} for {self.env}, got {self.policy!r}.")
        if self.model is not None:
            if not (isinstance(self.model, str) and self.model):
                raise ValueError(f"model must be a Hugging Face folder's path or None, got {self.model!r}.")
            if self.policy not in FROM_CHECKPOINT:
                raise ValueError(
                    f"model={self.model!r} needs a policy that starts from a checkpoint "
                    f"({', '.join(FROM_CHECKPOINT)}), got policy {self.policy!r}."
                )
        check_settings(self)
        for name in ("num_iterations", "eval_every", "eval_episodes"):
            check_positive_int(name, getattr(self, name))
        for name in ("hidden_sizes", "conv_channels"):  # a layer of width 0 would divide by zero in its init
            if not all(isinstance(width, int) and width >= 1 for width in getattr(self, name)):
                raise ValueError(f"{name} must be widths >= 1, got {getattr(self, name)!r}.")
        if self.num_iterations % self.eval_every:
            raise ValueError(
                f"num_iterations ({self.num_iterations}) must be a multiple of eval_every ({self.eval_every})."
            )
        self.check_learner_settings()
        if self.kl_coef_final is not None and not self.kl_coef_final >= 0:
            raise ValueError(f"kl_coef_final must be >= 0 or None, got {self.kl_coef_final!r}.")
        if self.kl_decay_iterations is not None:
            check_positive_int("kl_decay_iterations", self.kl_decay_iterations)
            if self.kl_coef_final is None:
                raise ValueError(
                    f"kl_decay_iterations={self.kl_decay_iterations} needs kl_coef_final (what beta decays to)."
                )
        if not (isinstance(self.probe_tasks, int) and self.probe_tasks >= 0):
            raise ValueError(f"probe_tasks must be an int >= 0, got {self.probe_tasks!r}.")
        if not (isinstance(self.probes_per_task, int) and self.probes_per_task >= 2):
            raise ValueError(
                f"probes_per_task must be an int >= 2 (one probe cannot tell), got {self.probes_per_task!r}."
            )
        if not (isinstance(self.warm_start_demonstrations, int) and self.warm_start_demonstrations >= 0):
            raise ValueError(f"warm_start_demonstrations must be an int >= 0, got {self.warm_start_demonstrations!r}.")
        check_positive_int("warm_start_steps", self.warm_start_steps)
        if not self.warm_start_learning_rate > 0:
            raise ValueError(f"warm_start_learning_rate must be > 0, got {self.warm_start_learning_rate!r}.")
        for name in ("warm_start_steps", "warm_start_learning_rate"):
            check_takes_effect(self, name, self.warm_start_demonstrations > 0, "`warm_start_demonstrations` > 0")
        check_takes_effect(self, "probes_per_task", self.probe_tasks > 0, "`probe_tasks` > 0")
        algorithm.check(self.algorithm_config, self.episodes_per_iteration)

    @property
    def num_periods(self) -> int:
        return self.num_iterations // self.eval_every

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with `changes` to fields of this class or of the algorithm's config (validated again)."""
        own = {name: value for name, value in changes.items() if name in RUN_FIELDS}
        others = {name: value for name, value in changes.items() if name not in own}
        if others:
            own["algorithm_config"] = dataclasses.replace(self.algorithm_config, **others)
        return dataclasses.replace(self, **own)

    def hyperparameters(self) -> Hyperparameters:
        """The config's own β, learning rate and the algorithm's sweepable values (FTW: N, J, C, K) as arrays."""
        return self.member_hyperparameters(self.algorithm, self.algorithm_config)


RUN_FIELDS = {field.name for field in dataclasses.fields(TrainConfig)}


def split_overrides(algorithm: str, overrides: Mapping[str, Any]) -> tuple[dict, dict]:
    """(settings that apply to a run of `algorithm`, those that belong only to other algorithms' configs).

    A name that no config declares raises ValueError.
    """
    run, own, others = algos.split_settings(algorithm, overrides, RUN_FIELDS)
    return {**run, **own}, others


class TrainCarry(flax.struct.PyTreeNode):
    """What one seed's program carries from iteration to iteration."""

    learner: Any  # the algorithm's state; `learner.policy` is the policy that plays
    key: jax.Array
    iteration: jax.Array  # [] int32
    env_steps: jax.Array  # [] int32: training env steps so far (evaluation not counted)
    hyperparameters: Hyperparameters


@dataclasses.dataclass(frozen=True)
class Trainer:
    """`init(key[, hyperparameters[, start]]) -> carry`; `run(carry, num_periods) -> (carry, (metrics, evaluation))`;
    `evaluate(key, carry) -> evaluation`.

    `metrics` leaves are [periods, eval_every] (per iteration), `evaluation` leaves [periods].
    `run` is jitted with `num_periods` static; vmap `init` and `run` over seeds (and hyperparameters).
    `start_params` are a checkpoint's weights for a pretrained policy, else None. Pass them to a
    compiled `init` as its `start` argument (unbatched under vmap): left out, they become constants of the
    program, which is slow to compile for large checkpoints.
    """

    config: TrainConfig
    env: envs.Environment
    policy: Any
    learner: Learner
    init: Any
    run: Any
    evaluate: Any  # (key, carry) -> evaluation: the same as a period's, e.g. of the starting policy
    start_params: Any = dataclasses.field(default=None, repr=False, compare=False)  # weights: not for printing

    def train(
        self, key: jax.Array, hyperparameters: Hyperparameters | None = None
    ) -> tuple[TrainCarry, tuple[dict, dict]]:
        # Jitted: run op by op, each of init's operations (the networks' initialisers, a warm start) would
        # compile as a program of its own.
        carry = jax.jit(self.init)(key, hyperparameters, self.start_params)
        return self.run(carry, self.config.num_periods)


def make_policy(
    config: TrainConfig, env: envs.Environment, num_outputs: int | None = None, pretrained: Pretrained | None = None
) -> PolicyNetwork:
    """The config's policy network, of the `pretrained` checkpoint's shape where the run starts from one; with
    `num_outputs` (1 for a critic) the same architecture with that many outputs."""
    assert config.policy is not None  # the environment's default, set when the config was made
    if pretrained is not None:  # the config checked that its policy can start from one
        return FROM_CHECKPOINT[config.policy](num_outputs or env.num_actions, env, pretrained)
    return ARCHITECTURES[config.policy](num_outputs or env.num_actions, env, config)


def example_trajectory(env: envs.Environment, env_params: Any, policy: PolicyNetwork) -> Trajectory:
    """An all-zero trajectory with the shapes and dtypes of one the policy plays in `env`."""

    def play(key):
        reset_key, init_key, play_key = jax.random.split(key, 3)
        observation, _ = env.reset(reset_key, env_params)
        params = policy.init(init_key, jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], observation))
        return rollout(play_key, Player(env, env_params, policy, params, jnp.zeros((), jnp.int32)))[0]

    return jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), jax.eval_shape(play, jax.random.key(0)))


def make_train(config: TrainConfig, **env_options: Any) -> Trainer:
    """Builds the training program for `config` (env options go to `ftw_jax.envs.make`); a `model` checkpoint is
    read here, once: its tokens write the environment, its shape and then its weights start the policy."""
    pretrained = None
    env = envs.make(config.env, **env_options)
    if config.model is not None:
        from ftw_jax.lm.load import load_pretrained  # only a run from a checkpoint loads the LM package

        pretrained = load_pretrained(config.model)
        env = env.written_in(pretrained.tokenizer, pretrained.config.vocab_size)
    if config.probe_tasks and not env.has_success:
        raise ValueError(f"probe_tasks needs an environment with a notion of success; {config.env} has none.")
    env_params = env.default_params()
    policy = make_policy(config, env, pretrained=pretrained)
    optimizer = make_optimizer(config)
    context = Context(
        policy=policy,
        make_network=functools.partial(make_policy, config, env, pretrained=pretrained),
        optimizer=optimizer,
        example=example_trajectory(env, env_params, policy),
        episodes_per_iteration=config.episodes_per_iteration,
        init_params=make_init_params(config, env, env_params, policy),
        critic_from_start=pretrained is not None,
    )
    start_params = None
    if pretrained is not None:
        from ftw_jax.policies.lm import checkpoint_params

        start_params = checkpoint_params(cast("LMPolicy", policy), pretrained)  # FROM_CHECKPOINT builds an LM
    learner = algos.get(config.algorithm).make_learner(config.algorithm_config, context)
    if not isinstance(learner, Learner):
        raise ValueError(f"{config.algorithm}'s make_learner returned {type(learner).__name__}, not a Learner.")

    def init(key: jax.Array, hyperparameters: Hyperparameters | None = None, start=start_params) -> TrainCarry:
        if hyperparameters is None:
            hyperparameters = config.hyperparameters()
        params_key, example_key, key = jax.random.split(key, 3)
        observation, _ = env.reset(example_key, env_params)
        observation = jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], observation)
        # An algorithm written before `start` existed still runs every policy but a pretrained one.
        starting = () if start is None else (start,)
        return TrainCarry(
            learner=learner.init(params_key, observation, hyperparameters, *starting),
            key=key,
            iteration=jnp.zeros((), jnp.int32),
            env_steps=jnp.zeros((), jnp.int32),
            hyperparameters=hyperparameters,
        )

    run = make_periods(config, env, env_params, policy, learner)
    return Trainer(
        config=config,
        env=env,
        policy=policy,
        learner=learner,
        init=init,
        run=run,
        evaluate=make_evaluation(config, env, env_params, policy),
        start_params=start_params,
    )


def make_init_params(
    config: TrainConfig, env: envs.Environment, env_params: Any, policy: PolicyNetwork
) -> Callable[[jax.Array, Any, Any], Any] | None:
    """`init_params(key, observation, start) -> params` of the starting policy: `start` (a checkpoint's) or its
    initialiser's, fitted to demonstrations first when the config asks for a warm start (None: no warm start)."""
    if not config.warm_start_demonstrations:
        return None
    if not env.has_expert:
        raise ValueError(f"warm_start_demonstrations needs an environment with a demonstrator; {config.env} has none.")
    settings = warm_start.WarmStart(
        config.warm_start_demonstrations, steps=config.warm_start_steps, learning_rate=config.warm_start_learning_rate
    )
    demonstrations = jax.eval_shape(  # shapes only: D trajectories are refused before they are played
        lambda key: warm_start.demonstrations(key, env, env_params, settings.demonstrations), jax.random.key(0)
    )
    check_state_memory(
        state_bytes(demonstrations),
        f"the warm start's {settings.demonstrations:,} demonstrations, for each seed",
        "use fewer `warm_start_demonstrations`",
    )

    def init_params(key, observation, start):
        init_key, fit_key = jax.random.split(key)
        params = policy.init(init_key, observation) if start is None else start
        return warm_start.fit_demonstrations(fit_key, env, env_params, policy, params, settings)[0]

    return init_params


def make_iteration(
    config: TrainConfig, env: envs.Environment, env_params: Any, policy: PolicyNetwork, learner: Learner
) -> Callable[[TrainCarry, tuple[jax.Array, jax.Array] | None], tuple[TrainCarry, dict]]:
    """`iteration(carry, tasks) -> (carry, metrics)`: B episodes with the current policy, then `learner.learn`."""

    def kl_coef_at(carry: TrainCarry) -> jax.Array:
        """β for this iteration: linear from the member's start value to `kl_coef_final` at iteration
        `kl_decay_iterations` − 1 (default: the last one), then constant."""
        horizon = config.kl_decay_iterations or config.num_iterations
        progress = jnp.minimum(carry.iteration / max(horizon - 1, 1), 1.0)
        start, final = carry.hyperparameters.kl_coef, config.kl_coef_final
        assert final is not None  # only called with a decay
        return ((start - final) * (1 - progress) + final).astype(jnp.float32)

    def iteration(carry: TrainCarry, tasks):
        key, play_key, update_key = jax.random.split(carry.key, 3)
        group_size, reset_keys = learner.group_size, None
        if tasks is not None:  # start states from the kept tasks (a group shares one)
            play_key, task_key = jax.random.split(play_key)
            task_keys, kept = tasks
            groups = probes.draw_tasks(task_key, task_keys, kept, config.episodes_per_iteration // group_size)
            reset_keys = jnp.repeat(groups, group_size, axis=0)
        state = carry.learner
        player = Player(env, env_params, policy, state.policy.params, state.policy.version)
        batch, success = rollouts(play_key, player, config.episodes_per_iteration, group_size, reset_keys)
        if config.kl_coef_final is not None:
            state = state.replace(policy=state.policy.replace(kl_coef=kl_coef_at(carry)))
        learning_rate = carry.hyperparameters.learning_rate
        if config.anneal_learning_rate:  # every optimizer state of the learner (PPO's critic too)
            learning_rate = learning_rate * (1.0 - carry.iteration / config.num_iterations)
            state = with_learning_rate(state, learning_rate)
        state, update_metrics = learner.learn(state, batch, update_key, carry.hyperparameters)
        env_steps = carry.env_steps + jnp.sum(batch.mask, dtype=jnp.int32)
        metrics = {
            **jax.tree.map(lambda m: m[-1], update_metrics),  # the iteration's last update
            **skips.update_counts(update_metrics),  # and how many of all U were applied or skipped
            "return_mean": jnp.mean(batch.episode_return),
            "return_max": jnp.max(batch.episode_return),
            "return_min": jnp.min(batch.episode_return),
            "success": jnp.mean(success),
            "env_steps": env_steps,
            "kl_coef": state.policy.kl_coef,
            "learning_rate": learning_rate,
            **batch_diagnostics(batch, group_size),
        }
        return carry.replace(learner=state, key=key, iteration=carry.iteration + 1, env_steps=env_steps), metrics

    return iteration


def batch_diagnostics(batch: Trajectory, group_size: int) -> dict:
    """What every method's batch says of its policy, computed alike for all: `policy_entropy`, the mean of
    −log q(a_t) over the policy's steps (an unbiased estimate of the acting policy's entropy per step), and
    for grouped methods (G > 1) `groups_tied`, the share of groups whose G returns are all equal (TRL's
    `frac_reward_zero_std`: such a group's advantages are all 0, it teaches nothing)."""
    steps = jnp.maximum(jnp.sum(batch.mask), 1)
    diagnostics = {"policy_entropy": -jnp.sum(jnp.where(batch.mask, batch.behaviour_logp, 0.0)) / steps}
    if group_size > 1:
        groups = batch.episode_return.reshape(-1, group_size)
        diagnostics["groups_tied"] = jnp.mean(jnp.all(groups == groups[:, :1], axis=1))
    return diagnostics


def make_evaluation(
    config: TrainConfig, env: envs.Environment, env_params: Any, policy: PolicyNetwork
) -> Callable[[jax.Array, TrainCarry], dict]:
    """`evaluate(key, carry) -> evaluation`: `eval_episodes` episodes of the current policy on the evaluation
    params, episode i on `env.evaluation_params(env_params, i)` (Sokoban: test level i, each once) (the key is
    consumed; the carry is only read)."""
    episode_params = functools.partial(env.evaluation_params, env_params)

    def evaluate(key: jax.Array, carry: TrainCarry) -> dict:
        policy_state = carry.learner.policy
        player = Player(env, env.evaluation_params(env_params), policy, policy_state.params, policy_state.version)
        play = functools.partial(
            rollouts, player=player, num_episodes=config.eval_episodes, episode_params=episode_params
        )
        greedy = {}
        if config.eval_greedy:  # on episodes of its own (a key split off: the sampled ones change with it)
            key, greedy_key = jax.random.split(key)
            greedy_episodes, greedy_success = play(greedy_key, greedy=True)
            greedy = {
                "greedy_return": jnp.mean(greedy_episodes.episode_return),
                "greedy_success": jnp.mean(greedy_success),
            }
        episodes, success = play(key)
        return {
            **greedy,
            "return": jnp.mean(episodes.episode_return),
            "success": jnp.mean(success),
            "iteration": carry.iteration,
            "env_steps": carry.env_steps,  # probes included
            "updates_applied": policy_state.version,  # optimizer steps applied so far
        }

    return evaluate


def make_periods(
    config: TrainConfig, env: envs.Environment, env_params: Any, policy: PolicyNetwork, learner: Learner
) -> Callable[[TrainCarry, int], tuple[TrainCarry, tuple[dict, dict]]]:
    """`run(carry, num_periods) -> (carry, (metrics, evaluation))`, jitted: the scan over evaluation periods,
    each (task filtering,) `eval_every` iterations, and an evaluation."""
    iteration = make_iteration(config, env, env_params, policy, learner)
    evaluate = make_evaluation(config, env, env_params, policy)

    def filtered_tasks(carry: TrainCarry):
        """(carry with the probes' key and env steps spent, (task keys [M], kept [M]))."""
        key, candidates_key, probe_key = jax.random.split(carry.key, 3)
        task_keys = jax.random.split(candidates_key, config.probe_tasks)
        policy_state = carry.learner.policy
        player = Player(env, env_params, policy, policy_state.params, policy_state.version)
        successes, probe_steps = probes.probe(probe_key, player, task_keys, config.probes_per_task)
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
        evaluation = {**evaluate(eval_key, carry), **filtering}
        return carry.replace(key=key), (metrics, evaluation)

    @functools.partial(jax.jit, static_argnums=1)
    def run(carry: TrainCarry, num_periods: int):
        return jax.lax.scan(period, carry, None, length=num_periods)

    return run
