"""A run's memory on one device, counted from its settings and the model's config before anything is loaded or
compiled: what `ftw-jax lm retrieval-qa --plan` prints, and what stops a run that would not fit.

    plan = memory_plan(config.learn, LMConfig.from_hf(hf_config), rollout_rows=64, rollout_slots=4548)
    print(plan.table(80 * 2**30))
    plan.check(80 * 2**30)          # ValueError naming the largest term and the settings that shrink it

The terms (`lm.memory.memory_estimate` counts the model's): the weights in their dtype (float32 master weights,
or bfloat16), their gradients and Adam's two moments (LoRA: the adapters' alone, the base frozen in the compute
dtype); the KL's reference (in the compute dtype under float32 masters; LoRA: the adapters'); the loss's
activations for the rows it holds at once (FTW: its J·K elites; GRPO and RLOO: the B episodes; PPO: a minibatch)
with or without remat, as the learner decides (`policies.lm.remat_for`); the loss's float32 logits, one chunk's
(`policies.lm.logits_chunk_for`); PPO's critic, a second model with its gradients, moments and activations; the
pool of N token sequences; and the rollouts' KV cache. It is an estimate: XLA fuses and reuses buffers, and
the attention scores are counted as a fused kernel keeps them (docs/lm.md compares it with XLA's count).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ftw_jax.agent.learner import LearnConfig
from ftw_jax.lm.config import LMConfig
from ftw_jax.lm.lora import TARGETS
from ftw_jax.lm.memory import memory_estimate, parameter_count, projection_shapes
from ftw_jax.policies.lm import logits_chunk_for, remat_for

GiB = 2**30
# Bytes a pool entry keeps per step: observation, action, behaviour version (int32), behaviour log-prob and
# reward (float32), mask and alive (bool).
POOL_BYTES_PER_STEP = 4 * 5 + 2


# When a term is held: through the run ("state"), or while the update runs, or while the rollouts play; the two
# phases follow each other, so the peak is the state and the larger phase.
PHASES = ("state", "update", "rollouts")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes of each term on one device, with when it is held, what holds it and what would shrink it."""

    terms: tuple[tuple[str, str, int, str], ...]  # (name, phase, bytes, what it holds)
    remedies: dict[str, str]  # a term's name -> the settings that make it smaller

    def phase(self, phase: str) -> int:
        return sum(size for _, held, size, _ in self.terms if held == phase)

    @property
    def total(self) -> int:
        """The peak: the state, and the update or the rollouts, whichever needs more."""
        return self.phase("state") + max(self.phase("update"), self.phase("rollouts"))

    def table(self, device_bytes: int | None = None) -> str:
        """The terms as a Markdown table in GiB, the peak, and the device's memory where known."""
        lines = ["| term | held | GiB | holds |", "|---|---|---:|---|"]
        lines += [f"| {name} | {held} | {size / GiB:,.2f} | {holds} |" for name, held, size, holds in self.terms]
        phases = ", ".join(f"{phase} {self.phase(phase) / GiB:,.2f}" for phase in PHASES)
        lines.append(f"| **peak** | | **{self.total / GiB:,.2f}** | {phases}: the state and the larger phase |")
        if device_bytes is not None:
            verdict = "fits" if self.total <= device_bytes else "does not fit"
            lines.append(f"| device | | {device_bytes / GiB:,.2f} | {verdict} |")
        return "\n".join(lines) + "\n"

    def check(self, device_bytes: int) -> None:
        """Refuses (ValueError, one line) a plan whose total exceeds the device's memory, naming the largest term
        and the settings that shrink it."""
        if self.total <= device_bytes:
            return
        name, _, size, _ = max(self.terms, key=lambda term: term[2])
        raise ValueError(
            f"the memory plan needs {self.total / GiB:,.1f} GiB a device, more than its {device_bytes / GiB:,.1f} "
            f"GiB; the largest term is {name} ({size / GiB:,.1f} GiB): {self.remedies.get(name, 'see the table')} "
            "(`plan` prints the whole table)."
        )


def _adapter_count(model: LMConfig, rank: int) -> int:
    """Parameters of LoRA's adapters (A [D_in, r], B [r, D_out]) on every targeted projection of every layer."""
    shapes = projection_shapes(model)
    return model.num_layers * sum(rank * sum(shapes[target]) for target in TARGETS)


def memory_plan(learn: LearnConfig, model: LMConfig, *, rollout_rows: int, rollout_slots: int) -> MemoryPlan:
    """The plan of a run learning `model` (a checkpoint's config) with `learn`, whose rollouts play
    `rollout_rows` conversations of `rollout_slots` columns at once."""
    rows, steps = learn.loss_rows, learn.max_length - 1
    algorithm = learn.algorithm_config
    if learn.algorithm == "ppo":  # a minibatch at a time
        rows = max(1, learn.episodes_per_iteration // getattr(algorithm, "num_minibatches", 1))
    compute = dataclasses.replace(model, dtype=learn.dtype, param_dtype=learn.param_dtype, lora_rank=0)
    remat = remat_for(compute, learn.remat, rows, steps)
    compute = dataclasses.replace(compute, remat=remat)
    chunk = logits_chunk_for(model.vocab_size, learn.logits_chunk, rows, steps)
    step = memory_estimate(compute, rows, steps, fused_attention=True, logits_chunk=chunk)
    other = memory_estimate(dataclasses.replace(compute, remat=not remat), rows, steps, fused_attention=True)
    width, master = np.dtype(learn.dtype).itemsize, np.dtype(learn.param_dtype).itemsize
    count = parameter_count(model)
    if learn.lora_rank is None:
        weights = ("weights", "state", count * master, f"{count / 1e9:.2f}B parameters in {learn.param_dtype}")
        trained, reference = count * master, count * (width if master > width else master)
    else:
        adapters = _adapter_count(model, learn.lora_rank)
        held = f"the base in {learn.dtype}, frozen; adapters float32"
        weights = ("weights", "state", count * width + adapters * 4, held)
        trained, reference = adapters * 4, adapters * 4
    terms = [
        weights,
        ("optimizer state", "state", 2 * trained, "Adam's two moments"),
        ("KL reference", "state", reference, "the starting weights the KL is taken to"),
        ("gradients", "update", trained, "of the trained parameters, in their dtype"),
        (
            "activations",
            "update",
            step["activations"],
            f"{rows} rows of {steps} steps, remat {'on' if remat else 'off'} ({other['activations'] / GiB:,.1f} "
            f"GiB {'off' if remat else 'on'})",
        ),
        ("logits", "update", step["logits"], f"float32, {chunk or steps} steps of each row at a time"),
    ]
    if learn.algorithm == "ppo":  # its activations come and go in its own step, as large as the policy's
        critic = 4 * count * master if learn.lora_rank is None else count * width + 3 * trained
        held = "PPO's value model: weights, gradients, Adam's two moments" + (", adapters'" if learn.lora_rank else "")
        terms.append(("critic", "state", critic, held))
    pool = getattr(algorithm, "pool_capacity", learn.episodes_per_iteration)
    terms.append(("pool", "state", pool * steps * POOL_BYTES_PER_STEP, f"{pool} sequences of {steps} steps"))
    cache = memory_estimate(compute, rollout_rows, rollout_slots)["kv_cache"]
    terms.append(("rollouts' KV cache", "rollouts", cache, f"{rollout_rows} conversations of {rollout_slots} slots"))
    if learn.lora_rank is not None:
        merged = "the adapters merged into a copy for the rollouts"
        terms.append(("sampler's weights", "rollouts", count * width, merged))
    shrink = "a larger device or a mesh (not yet for this command)"
    return MemoryPlan(
        tuple(terms),
        {
            "weights": f"`lora_rank` (the base frozen in `dtype`) or `param_dtype` bfloat16, or {shrink}",
            "optimizer state": f"`lora_rank` or `param_dtype` bfloat16, or {shrink}",
            "gradients": f"`lora_rank` or `param_dtype` bfloat16, or {shrink}",
            "activations": "fewer rows in the loss (FTW: `num_batches` x `num_elites`; the baselines: "
            "`episodes_per_iteration`), `remat`, or a shorter episode",
            "logits": "a smaller `logits_chunk`",
            "critic": f"`lora_rank`, or {shrink}",
            "rollouts' KV cache": "fewer `episodes_per_iteration` or shorter turns and replies",
        },
    )
