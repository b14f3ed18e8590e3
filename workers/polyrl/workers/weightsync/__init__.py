"""The NATS side of weights: the model bundle (`bundle`), weight objects in the Object Store
(`store`, `bulk`), announcements (`announce`), which objects a replica needs and which the
trainer may prune (`chain`, `retention`), the trainer's publication (`publish`) and a
replica's sync (`sync`; a rollout worker's own side is `polyrl.workers.rollout.weights`).
The bytes themselves are `polyrl.workers.deltas`, the codec."""
