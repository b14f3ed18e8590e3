"""The contract everyone shares: resources, NATS naming, worker launches and wire messages.

Pydantic only: no torch, no kopf, no Kubernetes client, so the operator, the workers and the
local runner can all depend on it (enforced by import-linter).
"""
