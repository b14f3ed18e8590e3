"""Data-plane workers: trainers, rollout workers, workflow runners and the weight-delta codec."""
