"""`polyrl bench dataplane`'s parts on a small scale: the data plane with the null engine and
the null trainer moves samples, the stream comparison measures both sides, and an overloaded
trainer leaves no trajectory unaccounted for. (The benchmark itself runs them larger.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl.api.resources import ModelSource
from polyrl.bench import dataplane
from polyrl.local.natsserver import NatsServer
from polyrl.workers.models import loading as models

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("dataplane")
    model, tokenizer = models.make_model(
        ModelSource(path="tiny-llama://bench-dataplane", dtype="float32"), cache_dir=tmp / "m"
    )
    models.export(model, tokenizer, tmp / "bundle")
    return tmp / "bundle"


async def test_two_null_rollouts_move_samples_to_the_null_trainer(
    nats_server: NatsServer, bundle: Path
) -> None:
    figures = await dataplane.pipeline(nats_server.url, bundle, 2, warmup=1.0, window=2.0)
    assert figures["samples_per_s"] > 0
    assert figures["requests_per_s"] > 0
    assert (figures["episodes_failed"], figures["dead_letters"]) == (0, 0)


async def test_an_overloaded_trainer_leaves_no_trajectory_unaccounted_for(
    nats_server: NatsServer, bundle: Path
) -> None:
    figures = await dataplane.pipeline(
        nats_server.url, bundle, 2, warmup=1.0, window=2.0, delay=0.5
    )
    assert figures["published"] > 0
    assert figures["trained"] > 0
    # By the stream's own ids: every one trained once (none stale here), nothing else trained.
    assert figures["overload_unaccounted"] == 0, figures
    assert (figures["trained_twice"], figures["never_published"]) == (0, 0), figures
    assert figures["trained"] == figures["published"] - figures["dropped_stale"]


async def test_the_stream_comparison_measures_both_sides(nats_server: NatsServer) -> None:
    figures = await dataplane.stream_vs_raw(nats_server.url, 200)
    assert figures["raw_msgs_per_s"] > 0
    assert figures["trajectory_msgs_per_s"] > 0
    assert figures["message_bytes"] > 100
    assert 0 < figures["stream_over_raw"] < 10
    assert figures["trajectory_windowed_msgs_per_s"] > 0
    assert 0 < figures["windowed_over_awaited"] < 100
