import pytest

from idempotency import KeyInUse, KeyInvalid, KeyReused, KeyUnderReview, idempotent_function
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
def test_a_redelivery_of_an_event_under_review_raises_key_under_review():
    event = {"id": "evt_review", "amount": 5}
    handle(event)
    # As a lost lease no resolver could settle leaves it: waiting for an operator.
    IdempotencyRecord.objects.update(status=Status.NEEDS_REVIEW, expires_at=None)
    with pytest.raises(KeyUnderReview) as caught:
        handle(event)
    # Its own class: a consumer that retries KeyInUse later must not retry this one.
    assert not isinstance(caught.value, KeyInUse)
    assert caught.value.code == "idempotency_key_under_review"
    assert len(calls) == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "result"), [(b"", None), (b'{"handled": "by hand"}', {"handled": "by hand"})]
)
def test_a_call_an_operator_marked_succeeded_returns_the_result_given(body, result):
    from idempotency.outcomes import StoredResponse
    from idempotency.recovery import mark_records

    event = {"id": "evt_marked", "amount": 5}
    handle(event)
    IdempotencyRecord.objects.update(status=Status.NEEDS_REVIEW, expires_at=None)
    report = mark_records(
        IdempotencyRecord.objects.all(),
        Status.SUCCEEDED,
        responses=lambda record: StoredResponse(200, [], body),
    )
    assert len(report.changes) == 1
    assert handle(event) == result
    assert len(calls) == 1


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


@idempotent_function(
    scope="consumer:payments", key=lambda event: event["id"], exclude=["delivered_at"]
)
def handle_payment(event: dict) -> int:
    calls.append(event)
    return len(calls)


@idempotent_function(
    scope="tasks:charge",
    key=lambda order_id, *args, **kwargs: order_id,
    fields=["order_id", "amount"],
)
def charge(order_id: str, amount: int, sent_at: str = "", attempt: int = 0) -> int:
    calls.append({"order_id": order_id, "amount": amount})
    return amount


@idempotent_function(
    scope="tasks:refund",
    key=lambda refund_id, **options: refund_id,
    fingerprint=lambda refund_id, **options: (refund_id, options["amount"]),
)
def refund(refund_id: str, **options: object) -> int:
    calls.append({"refund_id": refund_id})
    return len(calls)


@idempotent_function(scope="tasks:notify", key=lambda user, **extra: user, exclude=["trace"])
def notify(user: str, **extra: object) -> int:
    calls.append({"user": user})
    return len(calls)


@pytest.mark.django_db
def test_exclude_drops_a_message_field_from_the_fingerprint():
    assert handle_payment({"id": "p1", "amount": 5, "delivered_at": "09:00"}) == 1
    assert handle_payment({"id": "p1", "amount": 5, "delivered_at": "09:05"}) == 1
    with pytest.raises(KeyReused):
        handle_payment({"id": "p1", "amount": 6, "delivered_at": "09:00"})
    assert len(calls) == 1


@pytest.mark.django_db
def test_fields_name_arguments_however_they_are_passed():
    assert charge("o1", 5, "09:00") == 5
    assert charge(order_id="o1", amount=5, sent_at="09:05", attempt=2) == 5
    with pytest.raises(KeyReused):
        charge("o1", 6)
    assert len(calls) == 1


@pytest.mark.django_db
def test_a_fingerprint_function_decides_what_counts():
    assert refund("r1", amount=5, note="first") == 1
    assert refund("r1", amount=5, note="again") == 1
    with pytest.raises(KeyReused):
        refund("r1", amount=7)
    assert len(calls) == 1


@pytest.mark.django_db
def test_exclude_names_keyword_arguments_collected_by_kwargs():
    assert notify("u1", text="hi", trace="a") == 1
    assert notify("u1", text="hi", trace="b") == 1
    with pytest.raises(KeyReused):
        notify("u1", text="bye", trace="a")


def test_fields_must_name_arguments():
    with pytest.raises(ValueError, match=r"fields should name its arguments, not amout"):
        idempotent_function(scope="s", key=lambda a, b: a, fields=["amout"])(lambda a, b: None)


def test_fields_must_be_a_list_of_names():
    with pytest.raises(ValueError, match="exclude should be a list of names, not a string"):
        idempotent_function(scope="s", key=lambda e: e, exclude="sent_at")(lambda e: None)


def test_fingerprint_and_fields_do_not_mix():
    with pytest.raises(ValueError, match="give fingerprint, or fields/exclude, not both"):
        idempotent_function(scope="s", key=lambda e: e, fingerprint=lambda e: e, fields=["id"])(
            lambda e: None
        )


# -- key functions that cannot give a key, and arguments bound by name


@idempotent_function(scope="consumer:ids", key=lambda event: event.get("id"))
def handle_by_id(event: dict) -> int:
    calls.append(event)
    return len(calls)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("event", "found"),
    [({}, "None (NoneType)"), ({"id": ""}, "an empty string"), ({"id": 42}, "42 (int)")],
)
def test_a_key_function_without_a_string_key_is_refused_naming_it(event, found):
    with pytest.raises(KeyInvalid) as caught:
        handle_by_id(event)
    detail = caught.value.detail
    assert f"of {__name__}.handle_by_id, {__name__}.<lambda>, returned {found}" in detail
    assert "non-empty string" in detail
    assert calls == [] and not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_events_without_an_id_never_share_the_key_none():
    for amount in (1, 2):
        with pytest.raises(KeyInvalid):
            handle_by_id({"amount": amount})
    assert not IdempotencyRecord.objects.filter(idem_key="None").exists()


@pytest.mark.django_db
def test_a_key_function_that_raises_is_refused_naming_it_and_the_exception():
    @idempotent_function(scope="events", key=lambda event: event["id"])
    def handle(event: dict) -> None:
        calls.append(event)

    with pytest.raises(KeyInvalid) as caught:
        handle({"amount": 1})
    detail = caught.value.detail
    assert f"The key function of {__name__}.{handle.__qualname__}, " in detail
    assert "<locals>.<lambda>, raised KeyError: 'id'" in detail
    assert isinstance(caught.value.__cause__, KeyError)
    assert calls == [] and not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_a_scope_function_without_a_scope_is_refused():
    guarded = idempotent_function(scope=lambda event: None, key=lambda event: event["id"])(
        lambda event: 1
    )
    with pytest.raises(ValueError, match="scope function of .* returned None"):
        guarded({"id": "e"})
    assert not IdempotencyRecord.objects.exists()


@idempotent_function(scope="tasks:capture", key=lambda order_ref, **_: order_ref)
def capture(order_ref: str, amount: str, sent_at: str | None = None) -> int:
    calls.append({"order_ref": order_ref})
    return len(calls)


@pytest.mark.django_db
def test_positional_and_keyword_calls_are_one_intent():
    assert capture("ORD-1", "19.90") == 1  # the key function takes order_ref by name
    assert capture(order_ref="ORD-1", amount="19.90") == 1
    assert capture("ORD-1", amount="19.90", sent_at=None) == 1
    with pytest.raises(KeyReused):
        capture(order_ref="ORD-1", amount="5.00")
    assert len(calls) == 1
    assert IdempotencyRecord.objects.get().idem_key == "ORD-1"


@pytest.mark.django_db
def test_a_key_function_with_its_own_parameter_names_gets_the_arguments_in_order():
    guarded = idempotent_function(scope="s", key=lambda e, n: f"{e['id']}:{n}")(
        lambda event, attempt=0: calls.append(event) or len(calls)
    )
    assert guarded({"id": "e"}, 1) == 1
    assert guarded({"id": "e"}, attempt=1) == 1
    assert IdempotencyRecord.objects.get().idem_key == "e:1"


@pytest.mark.django_db
def test_wrong_arguments_fail_before_any_record():
    with pytest.raises(TypeError):
        capture("ORD-2")  # amount is missing
    assert not IdempotencyRecord.objects.exists()
