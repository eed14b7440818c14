"""What an algorithm is to the training program: its settings, its learner state and its `learn` step.

An algorithm module declares its config (a frozen dataclass of `ftw_jax.core.settings.setting` fields) and
`make_learner(config, context) -> Learner`, and is one line of the registry (`ftw_jax.algos.ALGORITHMS`).
The training program plays episodes with `state.policy` and hands every batch to `learn`; it never asks
which algorithm it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import optax

from ftw_jax.core.losses import ChunkedLogits
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.settings import setting
from ftw_jax.core.state import PolicyState


class Policy(Protocol):
    """What an algorithm uses of a network (`ftw_jax.policies.base.PolicyNetwork` declares all of it)."""

    markov: ClassVar[bool]  # the logits at step t depend on observation t alone
    cached: ClassVar[bool]  # it acts one token at a time through a KV cache

    def chunked_logits(self) -> ChunkedLogits | None:
        """Its logits as a head over features, for the update to make in chunks; None: made whole."""
        ...

    def init(self, key: jax.Array, observation: Any, /) -> Any:
        """The network's params for `observation` [T, ...]."""
        ...

    def apply(self, params: Any, observation: Any, /) -> Any:
        """Logits [T, A] (a critic: values [T, 1]) for `observation` [T, ...]."""
        ...


def updates_per_iteration_setting() -> Any:
    """U, declared by every algorithm that takes several steps per batch."""
    return setting(1, "U, updates per iteration (FTW: from the pool; GRPO: steps on the batch; PPO: epochs)")


class Hyperparameters(flax.struct.PyTreeNode):
    """What may differ between the members of one compiled program (a sweep vmaps over these)."""

    kl_coef: jax.Array  # [] float32: β at the start (it decays to `kl_coef_final` if that is set)
    learning_rate: jax.Array  # [] float32
    algorithm: Any = None  # the algorithm's own (FTW: its `Sizes`, inside the config's maxima)


def _is_injected(node: Any) -> bool:
    return isinstance(node, (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState))


def with_learning_rate(tree: Any, learning_rate: jax.typing.ArrayLike) -> Any:
    """`tree` (an optimizer state, or a learner state holding several) with the learning rate of every
    `optax.inject_hyperparams` state in it set: a member's own in a sweep, or this iteration's when annealed."""
    rate = jnp.asarray(learning_rate, jnp.float32)
    set_rate = lambda node: node._replace(hyperparams={**node.hyperparams, "learning_rate": rate})  # noqa: E731
    return jax.tree.map(lambda node: set_rate(node) if _is_injected(node) else node, tree, is_leaf=_is_injected)


@dataclasses.dataclass(frozen=True)
class Context:
    """What the training program gives an algorithm."""

    policy: Policy
    # The policy's architecture with that many outputs (a critic: 1); None where there is no such network (an LM).
    make_network: Callable[[int], Policy] | None
    optimizer: optax.GradientTransformation  # its learning rate injected (`optax.inject_hyperparams`)
    example: Trajectory  # an all-zero trajectory [T, ...]: the shapes `learn` receives, batched
    episodes_per_iteration: int  # B
    # init_params(key, observation, start) -> the policy's starting params: `start` (a checkpoint's, or None for
    # `policy.init`'s), fitted to demonstrations where the run asks for a warm start. Default: `given_or_fresh_params`.
    init_params: Callable[[jax.Array, Any, Any], Any] | None = None
    # A critic (PPO's) takes the starting params where it shares their names: the model of a pretrained LM under a
    # fresh value head. False: the critic starts fresh.
    critic_from_start: bool = False
    # The KL reference's dtype where it is not the params' (an LM's compute dtype under float32 master weights).
    reference_dtype: str | None = None
    # frozen(path) -> whether the params' leaf there never changes (a LoRA policy's pretrained weights): the
    # optimizer leaves it and the KL's reference holds None there, reading the params' own (no second copy).
    frozen: Callable[[tuple], bool] | None = None

    def init_policy(
        self, key: jax.Array, observation: Any, hyperparameters: Hyperparameters, start: Any = None
    ) -> PolicyState:
        """Starting policy params (the KL's reference), the optimizer at the member's learning rate, β."""
        params = (self.init_params or self.given_or_fresh_params)(key, observation, start)
        state = PolicyState.create(
            params,
            self.optimizer,
            kl_coef=hyperparameters.kl_coef,
            reference_dtype=self.reference_dtype,
            frozen=self.frozen,
        )
        return state.replace(opt_state=with_learning_rate(state.opt_state, hyperparameters.learning_rate))

    def given_or_fresh_params(self, key: jax.Array, observation: Any, start: Any) -> Any:
        """`start` where given (an argument of the compiled init, not a constant of it), else fresh weights."""
        return self.policy.init(key, observation) if start is None else start


@dataclasses.dataclass(frozen=True)
class Learner:
    """An algorithm built for one environment and policy.

    init(key, observation [1, ...], hyperparameters, start=None) -> state, a pytree whose `policy` is a
        `PolicyState` starting from the params `start` (None: the policy's initialiser's).
    learn(state, batch [B, T, ...], key, hyperparameters) -> (state, metrics with leaves [U], one per step).
    """

    init: Callable[..., Any]
    learn: Callable[[Any, Trajectory, jax.Array, Hyperparameters], tuple[Any, dict]]
    group_size: int = 1  # episodes of a batch that share a start state (GRPO's G)
    steps_per_batch: int = 1  # optimizer steps `learn` tries on each batch (U), for the share of them applied


def _no_check(config: Any, episodes_per_iteration: int) -> None:
    del config, episodes_per_iteration


def _no_hyperparameters(config: Any) -> None:
    del config


def _updates_per_iteration(config: Any) -> int:
    return config.updates_per_iteration


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One registry entry."""

    name: str
    config: type  # its settings: a frozen dataclass whose fields are `setting`s
    make_learner: Callable[[Any, Context], Learner]
    # The config's sweepable values as arrays (`Hyperparameters.algorithm`); None: nothing of its own.
    hyperparameters: Callable[[Any], Any] = _no_hyperparameters
    # Refuses a config that does not fit B episodes per iteration (raises ValueError).
    check: Callable[[Any, int], None] = _no_check
    # The optimizer steps `learn` tries on each batch (`Learner.steps_per_batch`), from the config alone.
    steps_per_batch: Callable[[Any], int] = _updates_per_iteration
    # Setting -> the values `compare --search` tries, beside those every algorithm shares (`ftw_jax.lab.tuning`).
    search_space: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    # Its reference implementation's recipe: a value for each searched knob but the learning rate, β
    # (`kl_coef`) and β's horizon (`kl_decay_fraction`; None: β constant) included. `compare --search` runs it
    # beside the drawn configurations, at the task's learning rate (`ftw_jax.lab.tuning.reference_configuration`);
    # a knob it leaves out runs at its config's default, β at 0.
    reference: Mapping[str, Any] = dataclasses.field(default_factory=dict)
