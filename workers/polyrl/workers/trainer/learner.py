"""The learner: a policy's model, its optimizer and one GRPO step, with no I/O.

`Learner` is what every rank of a policy's trainer holds: the model (float32 for training,
cast to bf16 for publishing), AdamW, the step counters a checkpoint carries, and the GRPO
update with truncated importance sampling against the behaviour log-probs. Rank 0 alone talks
to NATS (`leader.Leader`); this module is testable on its own, one rank or several.

With `algorithm.klCoef > 0` every rank keeps a frozen copy of the policy RL started from
(after the warm start) and adds the k3 KL to it to the loss; the copy is checkpointed with
the weights, so a resumed trainer is held to the same anchor. With `trainer.lora` the model
is the base with adapters (`models.lora`): only the adapters train and have optimizer state,
the KL anchor is the base with the adapters off (no copy), and what is published is each
version's adapter on a base sent once (`lora.sync: adapter`), or the merged model.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from polyrl.api.lora import LoraSync
from polyrl.api.resources import AlgorithmSpec, PolicySpec, ResolvedLoss, Strategy, UniformGroups
from polyrl.api.wire import Trajectory
from polyrl.workers.errors import ConfigError
from polyrl.workers.models import loading as models
from polyrl.workers.models import lora
from polyrl.workers.trainer import (
    batching,
    checkpoint,
    grpo,
    objectives,
    overlong,
    packing,
    shard_publish,
    sharded_checkpoint,
    sharding,
)

log = logging.getLogger("polyrl.trainer")


@dataclasses.dataclass(frozen=True, slots=True)
class _Fixed:
    """A micro-batch's log-probs that stay fixed over its batch's updates."""

    prox: torch.Tensor  # the trainer's own, before the batch's first update
    reference: torch.Tensor | None  # the KL anchor's, when klCoef > 0


class Learner:
    """The model, its optimizer and one GRPO step (no I/O: testable on its own)."""

    def __init__(
        self,
        policy: PolicySpec,
        algo: AlgorithmSpec,
        *,
        workdir: Path,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.policy, self.algo, self.rank, self.world = policy, algo, rank, world
        source = policy.model.model_copy(update={"dtype": "float32"})
        model, self.tokenizer = models.make_model(source, cache_dir=workdir / "models")
        if policy.trainer.activation_checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        spec = policy.trainer.lora
        self.model: Any = model if spec is None else lora.wrap(model, spec)
        opt = policy.trainer.optimizer
        self.optimizer = torch.optim.AdamW(
            lora.trainable(self.model), lr=opt.lr, weight_decay=opt.weight_decay
        )
        self.checkpoint_dir = workdir / "checkpoint"
        # A sharded checkpoint's weights load once the model is sharded (`_shard`).
        self.shards_to_load = sharded_checkpoint.holds_shards(self.checkpoint_dir)
        if self.shards_to_load:
            self.state = self._sharded_state()
        else:
            self.state = checkpoint.resume(self.checkpoint_dir, self.model, self.optimizer)
        self.reference: torch.nn.Module | None = None  # see `freeze_reference`
        self.last_ages: dict[int, int] = {}  # the last batch's samples by age, in versions
        self.parts: shard_publish.ShardParts | None = None  # sharded: what it publishes
        self.memory_said = False  # each rank's memory, after its first step (`step`)
        self.writer: sharded_checkpoint.Writer | None = None  # sharded: its checkpoints

    @property
    def sharded(self) -> bool:
        """`strategy: fsdp2`, once `sync_from_leader` has sharded the model: from then on
        every rank must join whatever gathers weights (`weights`, `save`)."""
        return sharding.is_sharded(self.model)

    def save(self) -> None:
        """Write the checkpoint (rank 0); sharded, every rank calls this and writes its own
        shards (`sharded_checkpoint`), which any number of ranks can resume from."""
        if not self.sharded:
            if self.rank != 0:
                return  # rank 0's weights are every rank's
            checkpoint.save(
                self.checkpoint_dir,
                self.model,
                self.optimizer,
                self.state,
                tokenizer=self.tokenizer,
                reference=self.reference,
                base=self.policy.model,
            )
            return
        assert self.writer is not None
        seconds = self.writer.save(
            self.checkpoint_dir,
            self.model,
            self.optimizer,
            self.state,
            rank=self.rank,
            tokenizer=self.tokenizer,
            reference=self.reference,
        )
        if self.writer.background:
            log.info(
                "sharded checkpoint at step %d: shards copied in %.2f s, written in the background",
                self.state.step, seconds,
            )  # fmt: skip
        else:
            log.info("sharded checkpoint at step %d saved in %.2f s", self.state.step, seconds)

    def saved(self) -> None:
        """Every rank of a sharded trainer, before it ends: the checkpoint still being
        written in the background (`checkpoint.asyncWrites`) written and in place."""
        if self.writer is not None:
            self.writer.wait()

    def _sharded_state(self) -> checkpoint.TrainerState:
        """A sharded checkpoint's counters; its weights wait for `_shard`."""
        if self.policy.trainer.strategy != Strategy.FSDP2:
            raise ConfigError(
                f"the checkpoint in {self.checkpoint_dir} was written by a sharded trainer "
                "(trainer.strategy fsdp2): resume it with fsdp2, on any number of ranks"
            )
        state = checkpoint.read_state(self.checkpoint_dir)
        if state is None:
            raise ConfigError(f"the sharded checkpoint in {self.checkpoint_dir} has no state")
        checkpoint.log_resumed(self.checkpoint_dir, state)
        return state

    def freeze_reference(self) -> None:
        """The KL term's anchor (klCoef > 0): the policy RL starts from, frozen.

        That is the model after the warm start, or the checkpoint's saved anchor on resume
        (not the resumed weights, which RL has already moved). Rank 0's copy is broadcast, so
        every rank is held to the same one.
        """
        if self.algo.kl_coef == 0 or lora.is_lora(self.model):
            return  # under LoRA the anchor is the base: `_reference_logprobs`
        reference = copy.deepcopy(self.model)
        saved = checkpoint.load_reference(self.checkpoint_dir) if self.rank == 0 else None
        if saved is not None:
            reference.load_state_dict(saved, strict=False)
        if self.world > 1:
            for tensor in reference.state_dict().values():
                dist.broadcast(tensor, src=0)
        torch.nn.Module.eval(reference)  # transformers' `eval` is untyped
        self.reference = reference.requires_grad_(False)

    def anchor_here(self) -> None:
        """The KL anchor set to the weights as they are now, each rank its own shards: a
        sharded trainer warms up after `freeze_reference` (`before_rl`), and RL starts from
        the warmed weights. No communication: every rank calls it after the warm-up."""
        if self.reference is None:
            return
        with torch.no_grad():
            pairs = zip(self.model.parameters(), self.reference.parameters(), strict=True)
            for mine, anchor in pairs:
                anchor.copy_(mine)

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights as rollout engines and exports see them (merged under LoRA);
        sharded, gathered whole on every rank, which must all call this."""
        if lora.is_lora(self.model):
            return lora.merged_state(self.model)
        if self.sharded:
            return sharding.full_state(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def weight_bytes(self) -> int:
        """The bf16 bytes of the weights `weights` returns, without gathering them."""
        tensors = self.weights() if lora.is_lora(self.model) else self.model.state_dict()
        return sum(t.numel() * 2 for t in tensors.values())

    def export(self, out_dir: Path) -> None:
        """The policy as an HF directory (merged under LoRA): the model bundle's source."""
        if lora.is_lora(self.model):
            base = lora.base_model(self.model)
            models.export(base, self.tokenizer, out_dir, weights=self.weights())
        else:
            models.export(self.model, self.tokenizer, out_dir)

    def bf16(self) -> dict[str, torch.Tensor]:
        return {k: v.to(torch.bfloat16) for k, v in self.weights().items()}

    @property
    def sends_adapters(self) -> bool:
        """LoRA with adapter sync: rollout pools get the base once, then adapters alone."""
        spec = self.policy.trainer.lora
        return spec is not None and spec.sync == LoraSync.ADAPTER

    def published(self) -> dict[str, torch.Tensor]:
        """What each weight version sends rollout pools, in bf16: the adapter under adapter
        sync (PEFT's names), else the (merged) weights."""
        if self.sends_adapters:
            return {k: v.to(torch.bfloat16) for k, v in lora.adapter_state(self.model).items()}
        return self.bf16()

    def publish_part(self, version: int) -> list[shard_publish.Part]:
        """Sharded: this rank's parts of `version` (`shard_publish`), which ranks other than
        0 hand to rank 0 to write; every rank calls it at once."""
        if self.parts is None:
            raise RuntimeError("only a sharded model publishes in parts")
        rows = shard_publish.local_rows(self.model, self.rank)
        parts = self.parts.encode(rows, version)
        if self.rank != 0:
            self.parts.send(parts)
        return parts

    def base_bf16(self) -> dict[str, torch.Tensor]:
        """The frozen base under LoRA, in bf16: what adapter versions are served on."""
        return {
            k: v.to(torch.bfloat16) for k, v in lora.merged_state(self.model, merge=False).items()
        }

    def step(self, samples: list[batching.Sample]) -> dict[str, float]:
        """`updatesPerBatch` passes over this rank's share of `samples`, each pass one
        optimizer step per mini-batch (`miniBatches`).

        With `trainer.uniformGroups` skip or refill only the groups whose rewards differ are
        trained on. Every rank sees every sample, so all agree on the mini-batches and on
        whether anything is left to train.
        """
        self.model.train()
        loss = self.algo.resolved_loss()
        shaped = overlong.penalised(samples, loss) if loss.overlong_buffer else samples
        scored = batching.assign_advantages(shaped, normalize_std=loss.advantage_std)
        scored, cut = overlong.filtered(scored, loss)
        skip = self.policy.trainer.uniform_groups != UniformGroups.KEEP
        trained = batching.informative(scored) if skip else scored
        figures = _Figures()
        if trained:
            minis = [self._mini_batch(part) for part in _split(trained, self._mini_batches)]
            fixed: list[dict[int, _Fixed]] = [{} for _ in minis]
            for update in range(self.policy.trainer.updates_per_batch):
                for mini, kept in zip(minis, fixed, strict=True):
                    figures.add(self._update(mini, kept, loss), update=update)
        self.state.step += 1
        stats = figures.means()
        if self.world > 1 and not self.memory_said:  # once a life: every rank takes part
            stats |= self._memory_per_rank()
        stats["reward"] = sum(s.reward for s in samples) / len(samples)
        stats["trained_fraction"] = len(trained) / len(samples)
        if loss.overlong_filter:
            stats["overlong_fraction"] = cut / len(samples)
        # Tokens after the prompt the policy was shown, not trained on (a tool's output, a
        # user's turn in a conversation): 0 for one-turn samples.
        after = sum(len(s.completion_ids) for s in samples)
        shown = after - sum(map(batching.trained_tokens, samples))
        stats["shown_fraction"] = shown / after if after else 0.0
        return stats | self._staleness(samples)

    def _memory_per_rank(self) -> dict[str, float]:
        """What each rank holds after its first step, gathered to rank 0, which logs a line
        per rank and returns `held_mib_rank<r>` (parameters, gradients and AdamW state, this
        rank's shards under fsdp2) and `rss_gb_rank<r>` (resident memory) for the record."""
        self.memory_said = True
        held = sharding.held_bytes(self.model, self.optimizer)
        mine = (sum(held.values()) / 2**30, sharding.resident_gb(), held)
        seen: list[Any] = [None] * self.world
        dist.all_gather_object(seen, mine)
        figures = {}
        for rank, (total, resident, parts) in enumerate(seen):
            log.info(
                "rank %d holds %.3f GiB (parameters %.1f MiB, gradients %.1f MiB, AdamW "
                "%.1f MiB); resident %.2f GiB",
                rank, total, parts["parameter_bytes"] / 2**20, parts["gradient_bytes"] / 2**20,
                parts["optimizer_bytes"] / 2**20, resident,
            )  # fmt: skip
            figures[f"held_mib_rank{rank}"] = round(total * 1024, 1)
            figures[f"rss_gb_rank{rank}"] = round(resident, 3)
        return figures

    @property
    def _mini_batches(self) -> int:
        return self.policy.trainer.mini_batches

    def _mini_batch(self, part: list[batching.Sample]) -> _MiniBatch:
        """This rank's rows of one mini-batch, its micro-batches (as many as every other
        rank's: `packing.balanced`), and what its loss is divided by: the mini-batch's
        trained tokens and sequences over the world size (the gradient all-reduce averages
        over ranks)."""
        shards = [part[rank :: self.world] for rank in range(self.world)]
        plans = packing.balanced([self._plan(shard) for shard in shards])
        shard = shards[self.rank]  # empty on a rank past a small batch
        tokens = [batching.trained_tokens(s) for s in part]
        normaliser = objectives.Normaliser(
            tokens=max(1.0, sum(tokens) / self.world),
            sequences=max(1.0, sum(1 for n in tokens if n) / self.world),
        )
        batch = batching.collate(shard, self._pad) if shard else None
        return _MiniBatch(batch, plans[self.rank], normaliser)

    @property
    def _pad(self) -> int:
        return int(self.tokenizer.pad_token_id or 0)

    def _plan(self, shard: list[batching.Sample]) -> packing.Plan:
        """A rank's micro-batches: by token budget (packed) or by `microBatchSize` rows."""
        budget = self.policy.trainer.micro_batch_tokens
        if budget is None:
            return packing.by_rows(len(shard), self.policy.trainer.micro_batch_size)
        return packing.by_tokens([len(s.prompt_ids) + len(s.completion_ids) for s in shard], budget)

    def _staleness(self, samples: list[batching.Sample]) -> dict[str, float]:
        """The mean age of the batch's samples in weight versions, and the share of each age
        (`staleness_<age>`): whether maxStaleness drops much, or rollouts keep up."""
        ages = grpo.age_histogram(samples, current_version=self.state.version)
        self.last_ages = ages  # for the Prometheus histogram (`polyrl.workers.runtime.prometheus`)
        return {
            "staleness": sum(age * n for age, n in ages.items()) / len(samples),
            **{f"staleness_{age}": n / len(samples) for age, n in ages.items()},
            "staleness_p50": grpo.age_quantile(ages, 0.5),
            "staleness_p95": grpo.age_quantile(ages, 0.95),
        }

    def _update(
        self, mini: _MiniBatch, fixed: dict[int, _Fixed], loss: ResolvedLoss
    ) -> list[dict[str, float]]:
        """One optimizer step over a mini-batch; a rank without rows in it still runs its
        (zero-weighted) micro-batches and joins the gradient all-reduce with zero gradients,
        so that every rank takes the same step."""
        self.optimizer.zero_grad(set_to_none=True)
        stats = self._backward(mini, fixed, loss)
        self._average_gradients()
        settings = self.policy.trainer.optimizer
        torch.nn.utils.clip_grad_norm_(lora.trainable(self.model), settings.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = scheduled_lr(self.state.step, settings.lr, settings.lr_warmup_steps)
        self.optimizer.step()
        return stats

    def _backward(
        self, mini: _MiniBatch, fixed: dict[int, _Fixed], loss: ResolvedLoss
    ) -> list[dict[str, float]]:
        """Accumulate the loss gradient of a mini-batch, micro-batch by micro-batch; each
        micro-batch's figures.

        `fixed` holds what stays constant across a batch's updates, per micro-batch; the first
        update fills it. Its log-probs are the trust region's anchor (`prox`), so later updates
        of the same batch stay within the clip of the policy the batch started from.
        """
        stats = []
        for index, rows in enumerate(mini.plan):
            if not rows or mini.batch is None:
                self._idle_pass(index, fixed)  # as many passes as the other ranks
                continue
            part = _rows(mini.batch, rows)
            new = self._logprobs(self.model, part)
            if index not in fixed:
                fixed[index] = _Fixed(new.detach(), self._reference_logprobs(part))
            value, figures = objectives.policy_loss(
                new,
                part.old_logprobs,
                part.advantages,
                part.loss_mask,
                loss=loss,
                prox=fixed[index].prox,
                ref=fixed[index].reference,
                kl_coef=self.algo.kl_coef if fixed[index].reference is not None else 0.0,
                normaliser=mini.normaliser,
            )
            value.backward()  # type: ignore[no-untyped-call]
            stats.append(figures)
        return stats

    def _idle_pass(self, index: int, fixed: dict[int, _Fixed]) -> None:
        """A zero-weighted pass that meets the other ranks' collectives in their order: the
        model's forward, a sharded KL anchor's forward (first update only, as theirs), then
        the model's backward."""
        logits = packing.idle_forward(self.model, self._pad)
        if index not in fixed and self.reference is not None and self.sharded:
            with torch.no_grad():
                packing.idle_forward(self.reference, self._pad)
            fixed[index] = _IDLE
        (logits.sum() * 0.0).backward()  # type: ignore[no-untyped-call]

    def _reference_logprobs(self, part: batching.Batch) -> torch.Tensor | None:
        if self.algo.kl_coef > 0 and lora.is_lora(self.model):
            with torch.no_grad(), lora.adapters_off(self.model):
                return self._logprobs(self.model, part)
        if self.reference is None:
            return None
        with torch.no_grad():
            return self._logprobs(self.reference, part)

    def _logprobs(self, model: Any, part: batching.Batch) -> torch.Tensor:
        """`model`'s log-probs of the completion tokens of `part`, at sampling temperature:
        as one packed row under `microBatchTokens`, else padded rows."""
        score = (
            batching.completion_logprobs
            if self.policy.trainer.micro_batch_tokens is None
            else packing.packed_logprobs
        )
        return score(
            model, part.input_ids, part.attention_mask, part.loss_mask, self.algo.temperature
        )

    def _average_gradients(self) -> None:
        if self.world == 1 or self.sharded:  # fully_shard reduce-scatters the mean itself
            return
        for param in lora.trainable(self.model):
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)
            param.grad /= self.world

    def sync_from_leader(self) -> None:
        """Give every rank rank 0's weights, optimizer state and counters.

        Rank 0 alone warms up and resumes from the checkpoint (other ranks may be on other
        nodes, without it); from then on identical starts and averaged gradients keep the
        ranks identical.
        """
        if self.world > 1:
            for tensor in self.model.state_dict().values():
                dist.broadcast(tensor, src=0)
            shared: list[Any] = [self.optimizer.state_dict(), self.state, self.shards_to_load]
            dist.broadcast_object_list(shared, src=0)
            if self.rank != 0:  # rank 0's checkpoint decides, seen or not from here
                self.optimizer.load_state_dict(shared[0])
                self.state, self.shards_to_load = shared[1], shared[2]
        self.freeze_reference()
        if self.policy.trainer.strategy == Strategy.FSDP2 and not self.sharded:
            self._shard()

    def _shard(self) -> None:
        """`strategy: fsdp2`: shard the model (and the KL anchor) over the ranks and move the
        optimizer, with its state, onto the shards. Done once every rank holds rank 0's
        weights: the warm-up and a resume ran on them whole."""
        mesh = sharding.mesh_of(self.world)
        precision = sharding.mixed_precision(mesh.device_type)
        sharding.shard(self.model, mesh, precision=precision)
        if self.reference is not None:
            sharding.shard(self.reference, mesh, precision=precision)
        opt = self.policy.trainer.optimizer
        self.optimizer = sharding.reshard_optimizer(
            self.optimizer,
            lora.trainable(self.model),
            lambda params: torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay),
        )
        every = shard_publish.keyframe_every(self.policy)
        self.parts = shard_publish.ShardParts.for_ranks(keyframe_every=every)
        background = self.policy.trainer.checkpoint.async_writes
        self.writer = sharded_checkpoint.Writer(background=background)
        if self.shards_to_load:
            seconds = sharded_checkpoint.load(
                self.checkpoint_dir, self.model, self.optimizer, reference=self.reference
            )
            self.shards_to_load = False
            log.info("sharded checkpoint loaded on %d ranks in %.2f s", self.world, seconds)
        sharding.release_freed_memory()
        params = list(self.model.parameters())
        log.info(
            "fsdp2: sharded over %d ranks; this rank holds %.1f of %.1f MiB of parameters",
            self.world,
            sharding.local_bytes(params) / 2**20,
            sum(p.numel() * p.element_size() for p in params) / 2**20,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _MiniBatch:
    """This rank's rows of a mini-batch (None: none), its micro-batches and normaliser."""

    batch: batching.Batch | None
    plan: packing.Plan
    normaliser: objectives.Normaliser


_IDLE = _Fixed(torch.empty(0), None)  # an idle rank's micro-batch: nothing to keep


def _rows(batch: batching.Batch, rows: list[int]) -> batching.Batch:
    """The rows `rows` of `batch` (consecutive ones as a view), trimmed to their longest."""
    index = slice(rows[0], rows[-1] + 1) if rows == list(range(rows[0], rows[-1] + 1)) else rows
    width = int(batch.attention_mask[index].sum(dim=1).max())
    return batching.Batch(
        input_ids=batch.input_ids[index, :width],
        attention_mask=batch.attention_mask[index, :width],
        loss_mask=batch.loss_mask[index, :width],
        old_logprobs=batch.old_logprobs[index, :width],
        advantages=batch.advantages[index, :width],
        rewards=batch.rewards[index],
        weight_versions=batch.weight_versions[index],
    )


class _Figures:
    """A step's loss figures over every micro-batch of every optimizer step on this rank:
    token-weighted means, but `loss` (each micro-batch's is its share of its mini-batch's
    loss: summed, then averaged over the passes) and `num_tokens` (summed)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.tokens = 0.0
        self.loss = 0.0
        self.passes: set[int] = set()

    def add(self, micro_batches: list[dict[str, float]], *, update: int) -> None:
        self.passes.add(update)
        for figures in micro_batches:
            weight = figures["num_tokens"]
            self.tokens += weight
            self.loss += figures["loss"]
            for key, value in figures.items():
                if key not in ("num_tokens", "loss"):
                    self.sums[key] = self.sums.get(key, 0.0) + weight * value

    def means(self) -> dict[str, float]:
        if self.tokens == 0:
            return {}
        out = {key: total / self.tokens for key, total in self.sums.items()}
        return out | {"loss": self.loss / len(self.passes), "num_tokens": self.tokens}


def _split(samples: list[batching.Sample], parts: int) -> list[list[batching.Sample]]:
    """`samples` in `parts` contiguous, near-equal mini-batches (groups mostly stay
    together); fewer when there are fewer samples than parts."""
    parts = max(1, min(parts, len(samples)))
    size, extra = divmod(len(samples), parts)
    out, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(samples[start:end])
        start = end
    return out


def scheduled_lr(step: int, lr: float, warmup_steps: int) -> float:
    """The learning rate of RL step `step` (0-based): a linear ramp to `lr` over `warmup_steps`.

    A function of the step counter alone, which checkpoints carry, so a resumed trainer picks
    the ramp up where it stopped without a scheduler's state.
    """
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (step + 1) / warmup_steps)


def to_samples(trajectories: list[Trajectory]) -> list[batching.Sample]:
    return [
        batching.Sample(
            prompt_ids=t.prompt_tokens,
            completion_ids=t.tokens,
            behaviour_logprobs=t.logprobs,
            reward=t.reward,
            group_id=t.group_id,
            weight_version=t.weight_version,
            completion_mask=t.loss_mask,
            finish_reason=t.finish_reason,
        )
        for t in trajectories
    ]


def shuffled_rewards(samples: list[batching.Sample], *, seed: int) -> list[batching.Sample]:
    """The control experiment's batch: the same samples with their rewards permuted."""
    rewards = [s.reward for s in samples]
    random.Random(seed).shuffle(rewards)
    return [dataclasses.replace(s, reward=r) for s, r in zip(samples, rewards, strict=True)]
