"""The LLM learner: updates from episodes that any rollout engine wrote (`ftw_jax.agent.lm_learn` runs it over a file).

    learner = EpisodeLearner.build(LearnConfig(max_length=65), model_config)
    state = learner.init(params)                      # the CausalLM's params ({"params": ...}): policy and reference
    state, metrics = learner.step(state, batch, key)  # trajectories [B, T] (`ftw_jax.agent.episodes`), one jitted call
    lm.save(folder, model_config, learner.model_params(state))

The policy is the model's next-token distribution over its whole vocabulary (`LMPolicy`), and the update is
the training program's own, of the algorithm the config names (`algos`). FTW's: the batch goes into the pool,
then U updates, each keeping the top K of J minibatches of C pool entries by reward and fitting the model by
token-level cross-entropy on their model-written tokens plus β·KL to the reference (exact, from the logits).
GRPO and RLOO (`reinforce` with `leave_one_out`) compare each episode with the others of its `group` (the
batch is put group by group first); PPO learns a critic, a value head on its own copy of the model, started
from the same checkpoint and kept in the learner state (so checkpoints resume it). With `lora_rank` the model
trains low-rank adapters over a frozen base (`ftw_jax.lm.lora`), written merged. Staleness and importance ratios
read each token's own version and behaviour log-prob, so an episode written by several hot-loaded policy
versions is measured token by token. The in-process loop (`ftw-jax lm text-search`) calls the same `algos.ftw`
learner on the episodes it rolls out, so both paths make the same updates from the same episodes (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ftw_jax import algos
from ftw_jax.algos import defaults
from ftw_jax.algos.base import Context, Learner
from ftw_jax.algos.defaults import DEFAULT_ALGORITHM
from ftw_jax.algos.learner_settings import LearnerSettings, make_optimizer
from ftw_jax.core.checks import check_seed
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.settings import check_settings, check_takes_effect, setting
from ftw_jax.lm import lora
from ftw_jax.lm.config import LMConfig
from ftw_jax.policies.lm import LMPolicy, as_model_params, as_policy_params, frozen_in_lora, logits_chunk_for, remat_for
from ftw_jax.running.memory import check_state_memory, check_working_memory, state_bytes


@dataclasses.dataclass(frozen=True)
class LearnConfig(LearnerSettings):
    """The LM learner's settings; the update's are `algorithm_config` (the algorithm's config; None: its defaults).
    See `for_task` for each LLM task's defaults."""

    algorithm: str = setting(
        DEFAULT_ALGORITHM,
        "the update: FTW, or a baseline as LLM trainers run it (GRPO, REINFORCE (RLOO with `leave_one_out`), PPO "
        "with a critic); GRPO and RLOO read each episode's `group`",
        choices=lambda: tuple(algos.ALGORITHMS),
    )

    max_length: int = setting(
        128, "the longest episode in tokens, prompt and tool output included (longer ones are refused)"
    )
    dtype: Literal["float32", "bfloat16"] = setting(
        "float32", "the dtype the model computes in, and the weights' dtype as written for the engine"
    )
    param_dtype: Literal["float32", "bfloat16"] = setting(
        "float32",
        "the weights' and optimizer state's dtype while learning (float32: master weights, the mixed precision "
        "of LLM trainers; bfloat16: half the memory, but updates smaller than a weight's rounding step are lost)",
    )
    logits_chunk: int | None = setting(
        None,
        "the loss makes the logits this many tokens of each episode at a time, so one chunk's [M, chunk, V] is in "
        "memory instead of the batch's (0: all at once; None: from a vocabulary of 32,768 up, all at once where the "
        "float32 logits of the loss's whole sequences fit 256 MiB, else the largest power of two up to 128 whose "
        "chunk's fit, e.g. 32 for Qwen's vocabulary and 8 sequences of 512 tokens; else 0)",
    )
    remat: bool | None = setting(
        None,
        "recompute each layer's activations in the backward pass instead of keeping them: memory for time (None: "
        "where the loss's sequences would keep more than 256 MiB of them, `lm.memory.memory_estimate`)",
    )
    seed: int = setting(0, "the seed of the learner's draws (selection, ties)")
    save_every: int = setting(1, "write the weights every this many iterations, and after the last")
    sampler_gap_limit: float = setting(
        0.1,
        "stop (exit 3, resumable) when the engine's log-probs are further than this from the learner's own, in nats "
        "per token, on episodes the learner's current version wrote (`sampler_gap` in metrics.jsonl): a temperature, "
        "top-p/top-k, processed log-probs or other weights; 0: never (a known mismatch accepted)",
    )
    stale_share_limit: float = setting(
        0.5,
        "with `max_staleness`: stop (exit 3, resumable) when more than this share of an iteration's episodes are "
        "older than it (the pool never selects them: the engine is not reloading the weights); 1: never",
    )
    lora_rank: int | None = setting(
        None,
        "train low-rank adapters of this rank on every attention and MLP projection instead of the whole model: "
        "the base frozen in `dtype`, only the adapters and their Adam state in float32; the weights written "
        "merged (None: the whole model)",
    )
    lora_alpha: float | None = setting(None, "the adapters' product is scaled by alpha / rank (None: alpha = rank)")
    algorithm_config: Any = None

    @classmethod
    def for_task(cls, task: str = "episodes", **overrides: Any) -> LearnConfig:
        """The defaults of this LLM task and algorithm (`ftw_jax.algos.defaults.LM_TASKS`: "episodes", an engine's
        episodes as `lm learn` reads them; "retrieval-qa") with `overrides`, each a field of this class or of the
        algorithm's config; a field of another algorithm's config is refused."""
        algorithm = overrides.get("algorithm", DEFAULT_ALGORITHM)
        settings = {**defaults.of(task, algos.get(algorithm).name, defaults.LM_TASKS), **overrides}
        run, own, others = algos.split_settings(algorithm, settings, LEARN_FIELDS)
        if others:
            raise ValueError(f"{', '.join(sorted(others))} do(es) not apply to {algorithm}.")
        if "algorithm_config" in run:  # given whole: the task's defaults for the algorithm do not apply
            return cls(**run)
        return cls(**run, algorithm_config=algos.get(algorithm).config(**own))

    def __post_init__(self):
        check_settings(self)
        algorithm = algos.get(self.algorithm)
        object.__setattr__(self, "algorithm_config", algos.config_of(self.algorithm, self.algorithm_config))
        self.check_learner_settings()
        check_seed("seed", self.seed)
        if not (isinstance(self.max_length, int) and self.max_length >= 2):
            raise ValueError(
                f"max_length must be an int >= 2 (a prompt token and one the model writes), got {self.max_length!r}."
            )
        if self.logits_chunk is not None and not (isinstance(self.logits_chunk, int) and self.logits_chunk >= 0):
            raise ValueError(f"logits_chunk must be None or an int >= 0, got {self.logits_chunk!r}.")
        self.check_lora()
        if not (isinstance(self.sampler_gap_limit, (int, float)) and self.sampler_gap_limit >= 0):
            raise ValueError(
                f"sampler_gap_limit must be >= 0 nats per token (0: never stop), got {self.sampler_gap_limit!r}."
            )
        if not (isinstance(self.stale_share_limit, (int, float)) and 0 <= self.stale_share_limit <= 1):
            raise ValueError(f"stale_share_limit must be in [0, 1] (1: never stop), got {self.stale_share_limit!r}.")
        check_takes_effect(
            self, "stale_share_limit", getattr(self.algorithm_config, "max_staleness", None) is not None,
            "`max_staleness`",
        )  # fmt: skip
        if not (isinstance(self.save_every, int) and self.save_every >= 1):
            raise ValueError(f"save_every must be an int >= 1, got {self.save_every!r}.")
        algorithm.check(self.algorithm_config, self.episodes_per_iteration)

    @property
    def loss_rows(self) -> int:
        """The sequences one loss holds the logits of at once, which the logits' chunk is sized for: FTW's J·K
        elites, a baseline's batch of B (PPO's minibatches are smaller: a bound)."""
        ftw = self.algorithm_config
        if hasattr(ftw, "num_batches") and hasattr(ftw, "num_elites"):
            return ftw.num_batches * ftw.num_elites
        return self.episodes_per_iteration

    def check_lora(self) -> None:
        if self.lora_rank is not None and not (
            isinstance(self.lora_rank, int) and not isinstance(self.lora_rank, bool) and self.lora_rank >= 1
        ):
            raise ValueError(f"lora_rank must be None or an int >= 1, got {self.lora_rank!r}.")
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha must be None or > 0, got {self.lora_alpha!r}.")
        check_takes_effect(self, "lora_alpha", self.lora_rank is not None, "`lora_rank`")
        if self.lora_rank is not None and getattr(self.algorithm_config, "reference", "initial") != "initial":
            raise ValueError(
                "`reference` previous moves the KL's reference with the weights; with `lora_rank` the "
                "reference is the base model (the adapters off): use `reference` initial."
            )

    def with_lora(self, model_config: LMConfig) -> LMConfig:
        """The model's config with this run's adapters (unchanged without `lora_rank`)."""
        if self.lora_rank is None:
            return model_config
        alpha = float(self.lora_rank if self.lora_alpha is None else self.lora_alpha)
        return dataclasses.replace(model_config, lora_rank=self.lora_rank, lora_alpha=alpha)

    def learns_a_batch_of(self, size: int) -> bool:
        """Whether the algorithm learns from a batch of `size` episodes (a short last one) with these settings."""
        try:
            algos.get(self.algorithm).check(self.algorithm_config, size)
        except ValueError:
            return False
        return True

    @property
    def steps_per_batch(self) -> int:
        """The optimizer steps each batch is followed by (FTW, GRPO, REINFORCE: U; PPO: U epochs of M)."""
        return algos.get(self.algorithm).steps_per_batch(self.algorithm_config)

    @property
    def num_steps(self) -> int:
        """T: a trajectory's steps (each token after the first is one)."""
        return self.max_length - 1


LEARN_FIELDS = frozenset(field.name for field in dataclasses.fields(LearnConfig))

# The algorithm's learner state (`FTWLearnerState`, `PPOLearnerState`, ...): its `policy` is a `PolicyState`.
LearnerState = Any


def token_trajectory_spec(num_steps: int) -> Trajectory:
    """A token trajectory's shapes and dtypes [T], the pool's entries (`jax.ShapeDtypeStruct`s: nothing allocated
    before the memory check, however long T)."""

    def zeros() -> Trajectory:
        steps = lambda dtype: jnp.zeros((num_steps,), dtype)  # noqa: E731
        return Trajectory(
            observation=steps(jnp.int32),
            action=steps(jnp.int32),
            mask=steps(bool),
            behaviour_logp=steps(jnp.float32),
            behaviour_version=steps(jnp.int32),
            episode_return=jnp.zeros((), jnp.float32),
            reward=steps(jnp.float32),
            alive=steps(bool),
        )

    return jax.eval_shape(zeros)


@dataclasses.dataclass(frozen=True)
class EpisodeLearner:
    """The configured algorithm over token trajectories for one model shape."""

    config: LearnConfig
    model_config: LMConfig
    policy: LMPolicy
    learner: Learner
    learn: Callable[[LearnerState, Trajectory, Any], tuple[LearnerState, dict]]  # (state, batch, iteration)
    # `learn` compiled per batch size (a short last batch is another program), each checked before it first runs.
    programs: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, config: LearnConfig, model_config: LMConfig) -> EpisodeLearner:
        model_config = config.with_lora(model_config)
        remat = remat_for(model_config, config.remat, config.loss_rows, config.num_steps)
        model_config = dataclasses.replace(model_config, remat=remat)
        policy = LMPolicy(
            num_actions=model_config.vocab_size,
            config=model_config,
            max_length=config.num_steps,
            logits_chunk=logits_chunk_for(
                model_config.vocab_size, config.logits_chunk, config.loss_rows, config.num_steps
            ),
        )
        learner = _learner(config, policy)
        seed = config.seed
        hyperparameters = functools.partial(config.member_hyperparameters, config.algorithm, config.algorithm_config)

        def learn(state, batch, iteration):  # everything but the state and the batch is made inside: with several
            key = jax.random.fold_in(jax.random.key(seed), iteration)  # processes, every input must be global
            return learner.learn(state, batch, key, hyperparameters())

        return cls(config, model_config, policy, learner, learn)

    def init(self, model_params: dict) -> LearnerState:
        """The learner state starting from (and KL-anchored to) these CausalLM params: an empty pool, version 0.
        Compiled (`init_program`); where the weights are laid out on a mesh (`lm.sharding.shard_params`), so is
        the state: the reference and Adam's moments like the weights (`param_specs`), the pool whole on every
        device."""
        init = self.init_program(model_params)
        check_state_memory(  # before anything is allocated: a pool of N sequences of max_length tokens, ...
            state_bytes(jax.eval_shape(init, model_params)) // max(jax.process_count(), 1),
            "the reference weights, Adam's moments and the pool of N sequences of `max_length` tokens",
            "use a smaller `pool_capacity` or `max_length`",
        )
        return init(model_params)

    def init_program(self, model_params: dict) -> Any:
        """`init`'s jitted function for weights laid out as these are (arrays, or ShapeDtypeStructs to lower it)."""

        def init(params):
            return self.learner.init(
                jax.random.key(0),
                jnp.zeros((1,), jnp.int32),
                self.config.member_hyperparameters(self.config.algorithm, self.config.algorithm_config),
                as_policy_params(params),
            )

        return jax.jit(init, out_shardings=_state_shardings(init, model_params))

    def step(self, state: LearnerState, batch: Trajectory, iteration: int) -> tuple[LearnerState, dict]:
        """(state, metrics with leaves [U]) after adding the batch [B, T] (numpy, or global arrays) to the pool and
        running U updates, with iteration `iteration`'s key (the same on a resumed run as on one never stopped).
        Its first call with a batch size compiles the program and refuses it, before it runs, where its working
        memory (XLA's count: J minibatches, the elites' logits, U updates' metrics) would not fit here."""
        size = batch.action.shape[0]
        if size not in self.programs:
            program = self.jitted(state).lower(state, batch, np.int32(iteration)).compile()
            check_working_memory(
                program.memory_analysis(),
                "one iteration of the learner",
                "use a smaller `num_batches`, `num_elites`, `updates_per_iteration` or `max_length`",
                holds="the state, the batch, J minibatches of C episodes, the elites' logits, U updates' metrics",
                devices=len(jax.tree.leaves(state)[0].sharding.device_set),  # the weights' mesh, or one device
            )
            self.programs[size] = program
        return self.programs[size](state, batch, np.int32(iteration))

    def jitted(self, state: Any, donate: bool = True) -> Any:
        """`learn` jitted for a state laid out as `state` is (arrays, or ShapeDtypeStructs to lower it), which the new
        state keeps: left to XLA, a mesh's norm weights came out sharded over "data" and the second step compiled
        again. The state is donated: its buffers take the next one, or a step would hold two copies of the weights,
        the reference and Adam's moments (3B on one device: 98.6 -> 85.5 GiB, experiments/lm/lm_compiled_memory.py)."""
        layout = jax.tree.map(lambda leaf: getattr(leaf, "sharding", None), state)
        return jax.jit(self.learn, donate_argnums=0 if donate else (), out_shardings=(layout, None))

    def model_params(self, state: LearnerState) -> dict:
        """The CausalLM's params in a learner state, as a plain checkpoint's (for `lm.save` and a sampler): with
        adapters, merged into the weights (`lm.lora.merged`)."""
        params = as_model_params(state.policy.params)
        return lora.merged(self.model_config, params) if self.model_config.lora_rank else params


def _state_shardings(init: Callable[[dict], LearnerState], model_params: dict) -> Any:
    """Shardings of the state `init` makes from weights on a mesh, every leaf laid out by `param_specs` (left to
    XLA, a compiled init copied Adam's moments whole onto every device: 7B on 2 x 4 devices, 67.4 GiB each
    instead of 17.7); None for weights that are not on a mesh."""
    from jax.sharding import NamedSharding

    from ftw_jax.lm.sharding import param_specs

    sharding = getattr(jax.tree.leaves(model_params)[0], "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    mesh = sharding.mesh
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(jax.eval_shape(init, model_params), mesh))


def _learner(config: LearnConfig, policy: LMPolicy) -> Learner:
    """The configured algorithm's learner over `policy`; a critic (PPO's) is the same model under a value head,
    started from the same checkpoint."""
    optimizer, frozen = make_optimizer(config), None
    if config.lora_rank is not None:  # Adam's state for the adapters (and a critic's head) alone
        frozen = frozen_in_lora
        labels = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
            lambda path, _: "frozen" if frozen_in_lora(path) else "trained", params
        )
        optimizer = optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)
    compute_reference = config.dtype != config.param_dtype or config.lora_rank is not None
    context = Context(
        policy=policy,
        make_network=lambda outputs: policy.clone(num_actions=outputs, logits_chunk=0),
        optimizer=optimizer,
        example=token_trajectory_spec(config.num_steps),
        episodes_per_iteration=config.episodes_per_iteration,
        critic_from_start=True,
        reference_dtype=config.dtype if compute_reference else None,  # the logits it gives are the same
        frozen=frozen,
    )
    return algos.get(config.algorithm).make_learner(config.algorithm_config, context)


def load_for_learning(model_path: pathlib.Path, config: LearnConfig) -> tuple[Any, dict]:
    """(the model, its params) as `config` learns them: the weights in `param_dtype`; with `lora_rank`, in `dtype`
    (frozen) with adapters beside them (B = 0: the same model). The model is the plain one a sampler runs (with
    `EpisodeLearner.model_params`, the adapters merged)."""
    from ftw_jax.lm.load import load

    if config.lora_rank is None:
        return load(model_path, dtype=config.dtype, param_dtype=config.param_dtype)
    model, params = load(model_path, dtype=config.dtype, param_dtype=config.dtype)
    return model, lora.with_adapters(jax.random.key(config.seed), config.with_lora(model.config), params)
