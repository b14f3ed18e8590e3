"""Benchmarks: `polyrl bench <what> --json` prints one JSON object of measured figures.

One module per benchmark, each with `run(*, quick: bool) -> dict[str, Any]`: `operator`
(apply-to-pods, scaling and idle cost on a real control plane), `delta` (weight-delta coding
and sync over NATS), `engine` (the torch engine's generation throughput), `pipeline`
(async against sync on the local runner; `--simulated`: with modelled generation and
training), `scale` (3 policies with up to 64 simulated rollout replicas each), `dataplane` (requests, responses and
trajectories driven hard, with a null engine and a null trainer), `tls` (NATS over TLS
against an open server), `lora` (LoRA against full fine-tuning) and `trainer` (padded
against packed micro-batches) and `sharding` (what each trainer rank holds under ddp and fsdp2, sharded checkpoints). Figures compare against a
baseline measured in the same run (ratios), and docs/benchmarks.md records them. Nothing outside this package
imports it; benchmarks may use test support (`polyrl.testing`) to start a control plane.
"""

BENCHMARKS = {
    "operator": "polyrl.bench.operator",
    "delta": "polyrl.bench.delta",
    "engine": "polyrl.bench.engine",
    "pipeline": "polyrl.bench.pipeline",
    "dataplane": "polyrl.bench.dataplane",
    "tls": "polyrl.bench.tls",
    "lora": "polyrl.bench.lora",
    "trainer": "polyrl.bench.trainer",
    "sharding": "polyrl.bench.sharding",
    "scale": "polyrl.bench.scale",
}
