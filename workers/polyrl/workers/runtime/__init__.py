"""What every worker process shares: its config, its NATS connection and heartbeats
(`worker`), riding out a NATS outage (`outage`), and its Prometheus metrics and readiness
probe (`prometheus`)."""
