"""A RuntimePool's Ready condition: True only when the pool is reconciled, its tenant
settings are published and its Deployment has the desired replicas available; otherwise
False with the first thing missing as the reason (no cluster needed)."""

from __future__ import annotations

from typing import Any

import pytest

from airuntime.k8s.conditions import RuntimePoolConditionReason as Reason
from airuntime.k8s.conditions import RuntimePoolConditionType as ConditionType
from airuntime_operator.pools import readiness
from airuntime_operator.status import with_condition


def _conditions(reconciled: str | None = "Applied", published: bool = True) -> list[Any]:
    conditions: list[Any] = []
    if reconciled is not None:
        conditions = with_condition(
            conditions, type_=ConditionType.RECONCILED, status=reconciled == Reason.APPLIED,
            reason=reconciled, message="the objects", generation=1,
        )  # fmt: skip
    return with_condition(
        conditions, type_=ConditionType.TENANT_SETTINGS_PUBLISHED, status=published,
        reason=Reason.PUBLISHED, message="", generation=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("conditions", "desired", "available", "expected"),
    [
        pytest.param(_conditions(), 2, 2, (True, "ReplicasAvailable"), id="available"),
        pytest.param(_conditions(), 2, 3, (True, "ReplicasAvailable"), id="surge"),
        pytest.param(_conditions(), 0, None, (True, "ReplicasAvailable"), id="zero-desired"),
        pytest.param(_conditions(), 2, 1, (False, "ReplicasUnavailable"), id="one-missing"),
        pytest.param(
            _conditions(published=False), 1, 1, (False, "TenantSettingsNotPublished"),
            id="settings-not-published",
        ),
        pytest.param(
            _conditions("InvalidSpec"), 1, 1, (False, "InvalidSpec"), id="invalid-spec"
        ),
        pytest.param(
            _conditions("ApplyFailed"), 1, 1, (False, "ApplyFailed"), id="apply-failed"
        ),
        pytest.param(
            _conditions(reconciled=None), 1, 1, (False, "NotReconciled"), id="not-reconciled"
        ),
    ],
)  # fmt: skip
def test_ready_reason(
    conditions: list[Any], desired: int, available: int | None, expected: tuple[bool, str]
) -> None:
    deployment = {"availableReplicas": available} if available is not None else {}
    status, reason, message = readiness(
        conditions, desired=desired, deployment=deployment, name="rt-a"
    )
    assert (status, reason) == expected
    assert message


def test_ready_messages_name_the_deployment_and_the_counts() -> None:
    _, _, missing = readiness(_conditions(), desired=2, deployment=None, name="rt-a")
    _, _, short = readiness(
        _conditions(), desired=3, deployment={"availableReplicas": 1}, name="rt-a"
    )
    _, reason, failed = readiness(
        _conditions("ApplyFailed"), desired=1, deployment=None, name="rt-a"
    )

    assert missing == "Deployment rt-a does not exist."
    assert short == "1/3 replicas of Deployment rt-a are available."
    assert (reason, failed) == ("ApplyFailed", "Not reconciled: the objects")
