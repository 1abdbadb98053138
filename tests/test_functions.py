import pytest

from idempotency import KeyInvalid, KeyReused, idempotent_function
from idempotency.models import IdempotencyRecord, Status

calls: list[dict] = []


@idempotent_function(scope="consumer:billing", key=lambda event: event["id"])
def handle(event: dict) -> dict:
    calls.append(event)
    return {"handled": event["id"], "runs": len(calls)}


@idempotent_function(scope=lambda event: f"tenant:{event['tenant']}", key=lambda event: event["id"])
def handle_per_tenant(event: dict) -> int:
    calls.append(event)
    return len(calls)


@idempotent_function(scope="consumer:failing", key=lambda event: event["id"])
def handle_failing(event: dict) -> None:
    calls.append(event)
    IdempotencyRecord.objects.count()  # a write path would roll back with the record
    raise RuntimeError("broker hiccup")


@pytest.fixture(autouse=True)
def _reset_calls():
    calls.clear()


@pytest.mark.django_db
def test_redelivery_returns_first_result_without_running_again():
    assert handle({"id": "evt_1", "amount": 5}) == {"handled": "evt_1", "runs": 1}
    assert handle({"amount": 5, "id": "evt_1"}) == {"handled": "evt_1", "runs": 1}
    assert len(calls) == 1
    record = IdempotencyRecord.objects.get()
    assert (record.scope, record.idem_key, record.status) == (
        "consumer:billing",
        "evt_1",
        Status.SUCCEEDED,
    )


@pytest.mark.django_db
def test_same_event_id_with_other_payload_is_a_conflict():
    handle({"id": "evt_2", "amount": 5})
    with pytest.raises(KeyReused):
        handle({"id": "evt_2", "amount": 6})
    assert len(calls) == 1


@pytest.mark.django_db
def test_scopes_are_independent():
    assert handle_per_tenant({"tenant": "a", "id": "e"}) == 1
    assert handle_per_tenant({"tenant": "b", "id": "e"}) == 2
    assert handle_per_tenant({"tenant": "a", "id": "e"}) == 1


@pytest.mark.django_db
def test_exception_records_nothing_and_the_event_can_be_redelivered():
    for _ in range(2):
        with pytest.raises(RuntimeError):
            handle_failing({"id": "evt_3"})
    assert len(calls) == 2
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_invalid_event_id_is_rejected_before_anything_is_written():
    with pytest.raises(KeyInvalid):
        handle({"id": "has space"})
    assert not calls
    assert not IdempotencyRecord.objects.exists()
