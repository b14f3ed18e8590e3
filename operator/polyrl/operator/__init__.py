"""The kopf operator: RLJob and PolicyGroup handlers, planning and reconciliation.

Never imports torch or `polyrl.workers` (enforced by import-linter), so the operator image
stays small.
"""
