"""The trainer process, run by torchrun on every rank (`python -m polyrl.workers.trainer`):
rank 0's NATS side (`leader`), the model and optimizer and one GRPO step (`learner`, `grpo`,
`batching`), data-parallel ranks (`ranks`), checkpoints (`checkpoint`, `ledger`), and what runs
before RL (`warmstart`, `warmup`, `scoring`)."""
