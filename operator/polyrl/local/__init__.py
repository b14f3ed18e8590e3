"""`polyrl run`: an RLJob on one machine, with the same workers the operator would start."""
