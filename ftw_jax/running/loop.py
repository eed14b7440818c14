"""One run loop for every command: the members of one compiled program, period by period.

    run = MemberRun(trainer, keys, hyperparameters, checkpointer)     # resumes from the latest checkpoint
    for metrics, evaluation in run.periods():                         # host arrays [M, eval_every] and [M]
        ...                                                           # logs, progress
    run.history                                                       # per period: evaluation values [M], ...

Members are seeds (`ftw-jax train`) or grid points × seeds (`ftw-jax sweep`, `compare`): one `vmap` over
them (on a single CPU device, a `lax.map`: `member_loop`), split over every device of every process
(`jax.distributed`) by a `NamedSharding`; every process gets all the results. After every period the carry is
checkpointed (the checkpointer decides how often), so a killed run goes on from its last checkpoint exactly as
if never stopped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.algos.base import Hyperparameters
from ftw_jax.running import skips
from ftw_jax.running.checkpoints import Checkpointer, rows_from_record, rows_record, save_then_stop
from ftw_jax.running.host import host_array, member_sharding
from ftw_jax.running.memory import check_state_memory, check_working_memory, state_bytes
from ftw_jax.running.signals import raise_if_stopped


class Program(Protocol):
    """What the loop runs of a training program (`ftw_jax.lab.train.Trainer` is one); it needs none of its code.

    `init(key, hyperparameters, start) -> carry` and `run(carry, num_periods) -> (carry, (metrics, evaluation))`,
    the carry holding `env_steps`, `iteration` and `learner.policy.version` ([] each); `evaluate(key, carry)`;
    `config`: `num_periods`, `eval_every`, `stop_after_skipped` and `hyperparameters()`; `learner.steps_per_batch`.
    """

    @property
    def config(self) -> Any: ...
    @property
    def learner(self) -> Any: ...
    @property
    def init(self) -> Callable[..., Any]: ...
    @property
    def run(self) -> Callable[[Any, int], tuple[Any, tuple[dict, dict]]]: ...
    @property
    def evaluate(self) -> Callable[[jax.Array, Any], dict]: ...
    @property
    def start_params(self) -> Any: ...


Carry: TypeAlias = Any  # a `Program`'s carry: one member's, or the members' stacked


def check_memory(trainer: Program, num_members: int, share: float = 0.5) -> None:
    """Refuses, before allocating anything, a run whose members' state (params, optimizer, pool, ...) alone would
    take more than `share` of the memory available."""
    per_member = state_bytes(jax.eval_shape(trainer.init, jax.random.key(0)))
    here = jax.local_device_count() / jax.device_count()  # this process holds its devices' share of the members
    check_state_memory(
        int(per_member * num_members * here),
        f"{num_members} member(s) x {per_member / 2**30:,.2f} GiB: params, optimizer state and the pool of N "
        "trajectories",
        "use a smaller pool (N) or fewer seeds or grid points",
        share,
    )


def history_arrays(history: list[dict]) -> dict[str, np.ndarray]:
    """Per-period rows {name: [M, ...]} as arrays {name: [M, periods, ...]}."""
    return {name: np.stack([row[name] for row in history], axis=1) for name in history[0]}


def seed_keys(seeds: list[int] | jax.Array | np.ndarray) -> jax.Array:
    """[S] PRNG keys, `jax.random.key(seed)` for each seed in [0, 2**32), made in one vectorised call (a Python
    loop of 1,000 calls took 1.8 s); inside jit too."""
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


MEMBER_LOOPS = ("auto", "vmap", "map")


def member_loop() -> str:
    """How one compiled program runs its members: "vmap" (batched) or "map" (one after another inside the
    program, `lax.map`). On a single CPU device batching buys no parallelism (one member already keeps the
    cores busy) and turns every matrix product with per-member weights into a slower batched one, so "auto"
    (the default) takes "map" there and "vmap" elsewhere. Set FTW_JAX_MEMBER_LOOP=vmap|map to choose."""
    choice = os.environ.get("FTW_JAX_MEMBER_LOOP", "auto")
    if choice not in MEMBER_LOOPS:
        raise ValueError(f"FTW_JAX_MEMBER_LOOP must be one of {MEMBER_LOOPS}, got {choice!r}.")
    if choice == "auto":
        return "map" if jax.default_backend() == "cpu" and jax.device_count() == 1 else "vmap"
    return choice


def over_members(
    run: Callable[[Carry, int], tuple[Carry, tuple[dict, dict]]], loop: str | None = None
) -> Callable[[Carry, int], tuple[Carry, tuple[dict, dict]]]:
    """`run(carry, num_periods)` (a `Trainer.run`) over the leading member axis of `carry`, by `member_loop()`."""
    if (loop or member_loop()) == "vmap":
        return jax.vmap(run, in_axes=(0, None))
    return lambda carry, num_periods: jax.lax.map(lambda member: run(member, num_periods), carry)


class MemberRun:
    """Members of one training program, initialised (or restored) and run one evaluation period at a time.

    Attributes after `periods()`: `carry` (sharded), `history` (per period: every evaluation value [M], the
    last iteration's training `train_return` [M], the skipped updates `skips.TOTALS` [M], and "metrics/NAME"
    [M, eval_every] for `metric_names`), `start_seconds` (making the members' state, a warm start included, and
    restoring it), `compile_seconds`, `clock` (per period run here: seconds since the start of training, env steps
    of all members), `periods_done_before` (restored from a checkpoint), `seconds` (starting, compiling and
    running, over every process that ran periods of these members: the checkpoints carry the count across a
    resume).

    A period after which some member has applied none of its last ready updates (`skips`: the config's
    `stop_after_skipped`, by default a whole period's) is checkpointed even between `--checkpoint-every`
    periods, yielded, and then `periods()` raises `skips.SkippedUpdates` naming those members by `labels`
    (default "member i"); `stops=False` only counts them.
    """

    def __init__(
        self,
        trainer: Program,
        keys: jax.Array,
        hyperparameters: Hyperparameters | None = None,
        checkpointer: Checkpointer | None = None,
        metric_names: tuple[str, ...] = (),
        labels: list[str] | None = None,
        stops: bool = True,
    ):
        self.trainer, self.checkpointer, self.metric_names = trainer, checkpointer, metric_names
        self.num_members = len(keys)
        self.labels = labels or [f"member {index}" for index in range(self.num_members)]
        self.stops = stops
        check_memory(trainer, self.num_members)
        if hyperparameters is None:  # every member the config's own
            hyperparameters = jax.tree.map(
                lambda leaf: jnp.stack([leaf] * self.num_members), trainer.config.hyperparameters()
            )
        assert hyperparameters is not None
        started = time.perf_counter()
        self.carry = self._init(keys, hyperparameters)
        self.history: list[dict] = []
        self.seconds_before = 0.0  # starting, compiling and running in the processes this one resumes
        restored = checkpointer.restore(self.carry) if checkpointer else None
        if restored:
            _, self.carry, record = restored
            # Checkpoints written before the skipped updates were counted: counted from here on.
            self.history = [{**skips.no_skips(self.num_members), **row} for row in rows_from_record(record["history"])]
            self.seconds_before = float(record.get("seconds", 0.0))  # absent from checkpoints before it was kept
        self.periods_done_before = len(self.history)
        self.env_steps_before = int(self.env_steps().sum())  # those of the processes this one resumes
        self.start_seconds = time.perf_counter() - started
        self.compile_seconds, self.clock = 0.0, []

    @property
    def seconds(self) -> float:
        """Seconds spent on these members' periods, this process and those it resumes: starting (where this process
        runs a period: restoring a finished run costs nothing), compiling and running."""
        if not self.clock:
            return self.seconds_before + self.compile_seconds
        return self.seconds_before + self.start_seconds + self.compile_seconds + self.clock[-1][0]

    def _init(self, keys: jax.Array, hyperparameters: Hyperparameters):
        sharding, padded = member_sharding(self.num_members)
        key_data = np.asarray(jax.random.key_data(keys))  # raw uint32: keys cannot be numpy arrays
        hyperparameters = jax.tree.map(np.asarray, hyperparameters)
        if padded > self.num_members:  # filler members (the last one's settings, fresh keys) whose results are dropped
            extra = padded - self.num_members
            fillers = jax.random.key_data(jax.random.split(jax.random.key(-1), extra))
            key_data = np.concatenate([key_data, np.asarray(fillers)])
            hyperparameters = jax.tree.map(
                lambda leaf: np.concatenate([leaf, np.repeat(leaf[-1:], extra, 0)]), hyperparameters
            )
        # Every process holds the same inputs and gives each of its devices that device's members.
        to_devices = lambda leaf: jax.make_array_from_callback(leaf.shape, sharding, lambda index: leaf[index])  # noqa: E731
        # A checkpoint's weights are an argument, shared by the members: as constants they would be compiled in.
        init = jax.jit(
            jax.vmap(
                lambda data, h, start: self.trainer.init(jax.random.wrap_key_data(data), h, start), in_axes=(0, 0, None)
            ),
            out_shardings=sharding,
        )
        arguments = (to_devices(key_data), jax.tree.map(to_devices, hyperparameters), self.trainer.start_params)
        compiled = init.lower(*arguments).compile()
        check_working_memory(
            compiled.memory_analysis(),
            "making the members' initial state",
            "use fewer `warm_start_demonstrations`, a smaller pool (N) or fewer seeds or grid points",
            holds="the members' state and the warm start's demonstrations",
        )
        return compiled(*arguments)

    def starting_evaluation(self, keys: jax.Array) -> dict[str, np.ndarray]:
        """Each member's evaluation of the policy it starts from, before any update ({name: [M]}), with one key
        per member (`keys` [M], consumed): the program's `evaluate` on the members' carry, the fillers left out."""
        members = jax.tree.map(lambda leaf: leaf[: self.num_members], self.carry)
        evaluation = jax.jit(jax.vmap(self.trainer.evaluate))(keys, members)
        return {name: host_array(value) for name, value in evaluation.items()}

    def env_steps(self) -> np.ndarray:
        """[M] training env steps of every member so far."""
        return host_array(self.carry.env_steps)[: self.num_members]

    def take_members(self, source: MemberRun, members: list[int]) -> None:
        """Goes on from `source`'s `members` (their carry and history, in this order) unless this run restored its
        own checkpoint: successive halving's next rung continues the runs it promotes. Both runs must be of the
        same program, this one's members being those of `source` (`members[i]` is this run's member i)."""
        if self.history:
            return
        if len(members) != self.num_members:
            raise ValueError(f"{len(members)} members given for a run of {self.num_members}.")
        sharding, padded = member_sharding(self.num_members)
        index = np.asarray(list(members) + [members[-1]] * (padded - self.num_members))
        take = jax.jit(lambda carry: jax.tree.map(lambda leaf: leaf[index], carry), out_shardings=sharding)
        self.carry = take(source.carry)
        self.history = [{name: np.asarray(value)[members] for name, value in row.items()} for row in source.history]
        self.periods_done_before = len(self.history)
        self.env_steps_before = int(self.env_steps().sum())

    def periods(self, until: int | None = None) -> Iterator[tuple[dict, dict]]:
        """Runs the periods left (those before period `until`, default the config's last), yielding each one's
        (metrics {name: [M, eval_every]}, evaluation {name: [M]})."""
        config = self.trainer.config
        last: int = config.num_periods if until is None else until
        if len(self.history) >= last:  # restored finished: nothing to compile
            return
        started = time.perf_counter()
        # Compiled ahead of time, so that throughput is reported without the compile.
        run_period = jax.jit(over_members(self.trainer.run), static_argnums=1)
        run_period = run_period.lower(self.carry, 1).compile()
        check_working_memory(run_period.memory_analysis())
        self.compile_seconds = time.perf_counter() - started
        started = time.perf_counter()
        limit = skips.limit_of(config.stop_after_skipped, self.updates_per_period) if self.stops else None
        for period in range(len(self.history), last):  # one period per call: same result as one scan
            raise_if_stopped()
            self.carry, (metrics, evaluation) = run_period(self.carry)
            metrics = {name: host_array(value)[: self.num_members, 0] for name, value in metrics.items()}
            evaluation = {name: host_array(value)[: self.num_members, 0] for name, value in evaluation.items()}
            before = self.history[-1] if self.history else skips.no_skips(self.num_members)
            self.history.append(
                {
                    **evaluation,
                    "train_return": metrics["return_mean"][:, -1],
                    **skips.totals_after(before, metrics),
                    **{f"metrics/{name}": metrics[name] for name in self.metric_names},
                }
            )
            self.clock.append((time.perf_counter() - started, int(self.env_steps().sum())))
            whole = "a whole period" if config.stop_after_skipped is None else ""
            stop = skips.stop_for_skips(self.labels, self.history[-1], limit, whole=whole)
            yield metrics, evaluation  # the caller writes the period's logs before the checkpoint counts it
            record = {"history": rows_record(self.history), "seconds": self.seconds}
            save_then_stop(self.checkpointer, period + 1, self.carry, record, last=period + 1 == last, stop=stop)

    def results(self) -> dict:
        """The history as arrays: evaluation values [M, periods], "metrics/NAME" [M, iterations]."""
        results = history_arrays(self.history)
        for name in self.metric_names:  # [M, periods, eval_every] -> [M, iterations]
            results[f"metrics/{name}"] = results[f"metrics/{name}"].reshape(self.num_members, -1)
        results["updates_applied_share"] = self.applied_share()  # [M]
        return results

    @property
    def updates_per_period(self) -> int:
        """Optimizer steps each member tries in one evaluation period (U per iteration)."""
        return self.trainer.config.eval_every * self.trainer.learner.steps_per_batch

    def updates_applied(self) -> np.ndarray:
        """[M] optimizer steps applied so far (the policy's version)."""
        return host_array(self.carry.learner.policy.version)[: self.num_members]

    def updates_skipped(self) -> dict[str, np.ndarray]:
        """{"updates_skipped", "updates_nonfinite"}: [M] ready steps skipped so far, and those of them skipped for
        a non-finite value (`skips`; steps before FTW's pool was ready are neither)."""
        last = self.history[-1] if self.history else skips.no_skips(self.num_members)
        return {name: np.asarray(last[name]) for name in ("updates_skipped", "updates_nonfinite")}

    def last_period_skipped(self) -> tuple[int, int]:
        """(ready steps skipped, steps tried) in the last period run, all members together: the progress line's."""
        skipped = self.history[-1]["updates_skipped"] - (
            self.history[-2]["updates_skipped"] if len(self.history) > 1 else 0
        )
        return int(np.sum(skipped)), self.num_members * self.updates_per_period

    def applied_share(self) -> np.ndarray:
        """[M] the share of the steps tried so far that were applied (skipped: not ready, nothing kept, not
        finite)."""
        tried = host_array(self.carry.iteration)[: self.num_members] * self.trainer.learner.steps_per_batch
        return self.updates_applied() / np.maximum(tried, 1)

    def throughput(self) -> float | None:
        """Training env steps per second over the periods run in this process (compile excluded)."""
        if not self.clock:
            return None
        return (self.clock[-1][1] - self.env_steps_before) / self.clock[-1][0]
