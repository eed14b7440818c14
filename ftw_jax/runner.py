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
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ftw_jax import skips
from ftw_jax.algos.base import Hyperparameters
from ftw_jax.checkpoints import Checkpointer, rows_from_record, rows_record

if TYPE_CHECKING:  # the run loop runs a training program; it needs none of its code
    from ftw_jax.train import TrainCarry, Trainer


class Interrupted(Exception):
    """A stop was asked for (SIGINT, SIGTERM): raised between two periods, once the last one is checkpointed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_stop_signal: list[int] = []  # the signal that asked this process to stop, if one did


def request_stop(signum: int, frame: types.FrameType | None = None) -> None:
    """A signal handler: the run stops after the period in progress (asked twice, at once)."""
    if _stop_signal:
        raise KeyboardInterrupt
    _stop_signal.append(signum)


def clear_stop() -> None:
    _stop_signal.clear()


def raise_if_stopped() -> None:
    """Raises `Interrupted` if a stop was asked for: call it between two units of work that are checkpointed."""
    if _stop_signal:
        raise Interrupted(_stop_signal[0])


def member_sharding(num_members: int) -> tuple[NamedSharding, int]:
    """A sharding of the member axis over every visible device, and the member count padded to fit it."""
    devices = np.array(jax.devices())
    padded = -(-num_members // len(devices)) * len(devices)
    return NamedSharding(Mesh(devices, ("members",)), PartitionSpec("members")), padded


def host_array(array: jax.Array) -> np.ndarray:
    """The whole of a member-sharded array on this host (gathered from the other processes if there are any)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def memory_available() -> int:
    """Bytes this process's share of the members may take: its devices' memory where JAX reports it (GPUs),
    else the host's RAM."""
    limits = [(device.memory_stats() or {}).get("bytes_limit") for device in jax.local_devices()]
    known = [limit for limit in limits if limit]
    if len(known) == len(limits):
        return int(sum(known))
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def state_bytes(spec: Any) -> int:
    """Bytes of a state's arrays, from its shapes (`jax.eval_shape`: nothing allocated); keys not counted."""
    return sum(
        leaf.size * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(spec)
        if not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )


def check_state_memory(needed: int, what: str, remedy: str, share: float = 0.5) -> None:
    """Refuses, before allocating anything, a state of `needed` bytes (`what` it holds) above `share` of the memory
    here (the program needs room for its temporaries too), naming the flags that would shrink it."""
    available = memory_available()
    if needed > share * available:
        raise ValueError(
            f"the run's state needs {needed / 2**30:,.1f} GiB ({what}), more than {share:.0%} of the "
            f"{available / 2**30:,.1f} GiB here; {remedy}."
        )


def check_memory(trainer: Trainer, num_members: int, share: float = 0.5) -> None:
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


def check_working_memory(
    stats: Any,
    what: str = "one evaluation period",
    remedy: str = "use smaller J, K, B or fewer seeds or grid points",
    *,
    holds: str = "the members' state, the episodes played, the elites gathered per update",
    devices: int = 1,
    share: float = 0.8,
) -> None:
    """Refuses, before running it, a compiled program (`what` it does) whose arguments, outputs and temporaries
    (XLA's own count; a donated argument counted once) exceed `share` of the memory here: large J·K, B or T make
    the update's working arrays big, and many members a state that is held twice while a new one is made.
    `devices`: how many devices run the program (XLA counts one device's share), against the memory of all."""
    if stats is None:
        return
    per_device = (
        stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes + stats.temp_size_in_bytes
    )
    needed, available = per_device * devices, memory_available()
    if needed > share * available:
        raise ValueError(
            f"{what} needs {needed / 2**30:,.1f} GiB of working memory (XLA's count: {holds}), more than "
            f"{share:.0%} of the {available / 2**30:,.1f} GiB here; {remedy}."
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
    run: Callable[[TrainCarry, int], tuple[TrainCarry, tuple[dict, dict]]], loop: str | None = None
) -> Callable[[TrainCarry, int], tuple[TrainCarry, tuple[dict, dict]]]:
    """`run(carry, num_periods)` (a `Trainer.run`) over the leading member axis of `carry`, by `member_loop()`."""
    if (loop or member_loop()) == "vmap":
        return jax.vmap(run, in_axes=(0, None))
    return lambda carry, num_periods: jax.lax.map(lambda member: run(member, num_periods), carry)


class MemberRun:
    """Members of one training program, initialised (or restored) and run one evaluation period at a time.

    Attributes after `periods()`: `carry` (sharded), `history` (per period: every evaluation value [M], the
    last iteration's training `train_return` [M], the skipped updates `skips.TOTALS` [M], and "metrics/NAME"
    [M, eval_every] for `metric_names`), `compile_seconds`, `clock` (per period run here: seconds since the
    start of training, env steps of all members), `periods_done_before` (restored from a checkpoint),
    `seconds` (compiling and running, over every process that ran these members: the checkpoints carry the
    count across a resume).

    A period after which some member has applied none of its last ready updates (`skips`: the config's
    `stop_after_skipped`, by default a whole period's) is checkpointed even between `--checkpoint-every`
    periods, yielded, and then `periods()` raises `skips.SkippedUpdates` naming those members by `labels`
    (default "member i"); `stops=False` only counts them.
    """

    def __init__(
        self,
        trainer: Trainer,
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
        self.carry = self._init(keys, hyperparameters)
        self.history: list[dict] = []
        self.seconds_before = 0.0  # compiling and running in the processes this one resumes
        restored = checkpointer.restore(self.carry) if checkpointer else None
        if restored:
            _, self.carry, record = restored
            # Checkpoints written before the skipped updates were counted: counted from here on.
            self.history = [{**skips.no_skips(self.num_members), **row} for row in rows_from_record(record["history"])]
            self.seconds_before = float(record.get("seconds", 0.0))  # absent from checkpoints before it was kept
        self.periods_done_before = len(self.history)
        self.env_steps_before = int(self.env_steps().sum())  # those of the processes this one resumes
        self.compile_seconds, self.clock = 0.0, []

    @property
    def seconds(self) -> float:
        """Seconds spent compiling and running these members' periods, this process and those it resumes."""
        return self.seconds_before + self.compile_seconds + (self.clock[-1][0] if self.clock else 0.0)

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
            "use fewer --warm-start-demonstrations, a smaller pool (N) or fewer seeds or grid points",
            holds="the members' state and the warm start's demonstrations",
        )
        return compiled(*arguments)

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
        until = config.num_periods if until is None else until
        if len(self.history) >= until:  # restored finished: nothing to compile
            return
        started = time.perf_counter()
        # Compiled ahead of time, so that throughput is reported without the compile.
        run_period = jax.jit(over_members(self.trainer.run), static_argnums=1)
        run_period = run_period.lower(self.carry, 1).compile()
        check_working_memory(run_period.memory_analysis())
        self.compile_seconds = time.perf_counter() - started
        started = time.perf_counter()
        limit = skips.limit_of(config.stop_after_skipped, self.updates_per_period) if self.stops else None
        for period in range(len(self.history), until):  # one period per call: same result as one scan
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
            stuck = skips.stuck(self.history[-1]["skipped_in_a_row"], limit)
            yield metrics, evaluation  # the caller writes the period's logs before the checkpoint counts it
            if self.checkpointer:
                self.checkpointer.save(
                    period + 1,
                    self.carry,
                    {"history": rows_record(self.history), "seconds": self.seconds},
                    final=period + 1 == until or bool(stuck.any()),  # a stopped run resumes from here
                )
            if stuck.any():
                assert limit is not None  # nothing is stuck without a limit
                raise skips.SkippedUpdates(
                    skips.stop_message(
                        [label for label, member_stuck in zip(self.labels, stuck) if member_stuck],
                        self.history[-1]["skipped_in_a_row"][stuck],
                        self.history[-1]["nonfinite_in_a_row"][stuck],
                        limit,
                        whole="a whole period" if config.stop_after_skipped is None else "",
                    )
                )

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
