"""Shared building blocks of the API models: camelCase wire names, strictness, conditions.

Every resource model accepts and emits camelCase (as Kubernetes does) while Python code
uses snake_case. Unknown fields are errors (`extra="forbid"`), matching the CRDs' structural
schemas, so a typo fails in `polyrl run` exactly as it fails in `kubectl apply`.
"""

from __future__ import annotations

import datetime
import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "polyrl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

DNS1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
Dns1035Name = Annotated[str, Field(pattern=DNS1035, min_length=1, max_length=63)]
# Resource quantities ("500m", "2Gi", 4) as Kubernetes writes them.
Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def memory_bytes(quantity: int | str) -> int:
    """A Kubernetes memory quantity in bytes ("8Gi", "500M", "1e9", 1024); ValueError if not one."""
    text = str(quantity).strip()
    for suffixes in (_BINARY, _DECIMAL):
        for suffix, factor in suffixes.items():
            if text.endswith(suffix):
                return int(float(text.removesuffix(suffix)) * factor)
    if text.endswith("m"):  # milli-bytes, which Kubernetes allows and nobody means
        return int(float(text[:-1]) / 1000)
    try:
        return int(float(text))
    except ValueError:
        raise ValueError(f"{quantity!r} is not a memory quantity") from None


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The camelCase JSON form, without unset optional fields."""
        data: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return data


class Resources(ApiModel):
    """Compute resources of a container (`requests` and `limits`, as in a Pod)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: 2, memory: 8Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. {nvidia.com/gpu: 1}."
    )


class Toleration(ApiModel):
    """A Pod toleration, so rollout pools can use tainted GPU or regional nodes."""

    key: str | None = Field(None, description="Taint key; empty with operator Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field(
        "Equal", description="How key and value are matched."
    )
    value: str | None = Field(None, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to tolerate; empty means all."
    )
    toleration_seconds: int | None = Field(
        None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(enum.StrEnum):
    """The conditions polyrl sets on RLJobs and PolicyGroups (`kubectl describe` shows them)."""

    READY = "Ready"  # both kinds: everything it needs runs and serves
    WORKERS_HEALTHY = "WorkersHealthy"  # both: no worker pod failed lately (else its cause)
    TRAINER_HEALTHY = "TrainerHealthy"  # a PolicyGroup with the trainer: trains or finished
    ROLLOUTS_READY = "RolloutsReady"  # a PolicyGroup: its rollout pods can run
    NATS_READY = "NatsReady"  # an RLJob: its NATS streams and buckets exist
    NATS_ISOLATED = "NatsIsolated"  # an RLJob: each role has a NATS user of its own
    STOPPED = "Stopped"  # an RLJob that ended, either way
    COMPLETE = "Complete"  # an RLJob that succeeded
    FAILED = "Failed"  # an RLJob that failed
    ADMITTED = "Admitted"  # a queued RLJob: Kueue admitted its gang (reason: Kueue's)
    SUSPENDED = "Suspended"  # a queued RLJob: suspended by its user or evicted by Kueue


class Condition(ApiModel):
    """A metav1.Condition: one aspect of an object's state, with why and since when."""

    type: str = Field(description="CamelCase kind of condition, e.g. Ready or TrainerHealthy.")
    # (A plain string: an object may carry conditions other controllers set.)
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase, machine-readable cause of the last transition.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(
        0, ge=0, description="The .metadata.generation this condition was set against."
    )


RFC3339 = "%Y-%m-%dT%H:%M:%SZ"
RFC3339_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"  # a MicroTime (Lease renewals, events' eventTime)


def now_rfc3339(*, micro: bool = False) -> str:
    """Now, as Kubernetes timestamps are written (RFC 3339, UTC; whole seconds, or micro-
    seconds for MicroTime fields). The one clock for status, events, nodes and pods."""
    return datetime.datetime.now(datetime.UTC).strftime(RFC3339_MICRO if micro else RFC3339)


def seconds_since(stamp: str) -> float:
    """Seconds from an RFC 3339 timestamp (as `now_rfc3339` writes them) until now."""
    then = datetime.datetime.strptime(stamp, RFC3339).replace(tzinfo=datetime.UTC)
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()


def set_condition(
    conditions: list[Condition],
    *,
    type: ConditionType,
    status: ConditionStatus | bool,
    reason: str,
    message: str = "",
    generation: int = 0,
) -> bool:
    """Set one condition in place; the transition time moves only when status changes.

    Returns True when anything visible changed, so callers can skip no-op patches.
    """
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    for i, cond in enumerate(conditions):
        if cond.type != type:
            continue
        changed = (cond.status, cond.reason, cond.message, cond.observed_generation) != (
            status,
            reason,
            message,
            generation,
        )
        stamp = cond.last_transition_time if cond.status == status else now_rfc3339()
        conditions[i] = Condition(
            type=type,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=stamp,
            observed_generation=generation,
        )
        return changed
    conditions.append(
        Condition(
            type=type,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=now_rfc3339(),
            observed_generation=generation,
        )
    )
    return True


def find_condition(conditions: list[Condition], type: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == type), None)
