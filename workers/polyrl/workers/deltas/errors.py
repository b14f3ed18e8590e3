"""Why a delta was refused.

Every refusal is a `DeltaError`, so a rollout worker can catch one type, log it and fall back to the
latest keyframe; the subclasses tell apart the cases that call for different reactions:

- `CorruptDelta`: the object itself is damaged or not ours (bad magic, unknown encoder version,
  truncated, container checksum wrong, sections that do not decode to what the header says). Fetch
  it again.
- `BaseVersionMismatch`: a sound delta for another base than the one the target holds. Apply the
  chain from the version held, or jump to a keyframe.
- `TargetMismatch`: the target state dict does not have the tensors the header names (missing or
  extra names, other shapes or dtypes, not a contiguous CPU tensor). A configuration error.
- `ChecksumMismatch`: everything decoded, but a resulting tensor's xxh3 differs from the trainer's.
  The target was not bit-identical to the base it claimed to be; it is rolled back, and only a
  keyframe can repair it.
"""


class DeltaError(Exception):
    """A delta or keyframe was refused; the target state dict is unchanged."""


class CorruptDelta(DeltaError):
    """The object is truncated, damaged or of an unknown format version."""


class BaseVersionMismatch(DeltaError):
    """The delta applies to another base version than the one held."""


class TargetMismatch(DeltaError):
    """The target's tensor names, shapes or dtypes differ from the header's."""


class ChecksumMismatch(DeltaError):
    """A decoded tensor's xxh3 differs from the one recorded by the encoder."""
