"""Lossless sparse weight deltas: bitwise diff, compact encoding, verified all-or-nothing apply.

The trainer calls `encode.encode_delta(published, new, ...)` each step and
`encode.encode_keyframe(state, ...)` every K versions; a rollout worker calls
`decode.apply_delta(state, blob, have_version=...)`, or `decode.load_keyframe(blob)` when it holds
nothing. Refusals are `errors.DeltaError`s and leave the target as it was. `format` documents the
container byte by byte, `sections` the encoding of changed elements (`polyrl bench delta`
measures size and speed). Pure functions of bytes and tensors: no networking, no operator dependency.

Moving the objects over NATS is `polyrl.workers.weightsync`, on top of the codec.
"""
