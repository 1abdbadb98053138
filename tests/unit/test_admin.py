"""The operators' admin: find records, read them, resolve them through the state machine."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from idempotency.admin import BODY_DISPLAY_LIMIT, readable_body
from idempotency.models import IdempotencyRecord, Status
from idempotency.resolvers import Resolution
from tests.support.factories import IdempotencyRecordFactory, UserFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:idempotency_idempotencyrecord_changelist"
RESOLVER = "tests.unit.test_admin.resolved_done"


def resolved_done(record: IdempotencyRecord) -> Resolution:
    return Resolution.done("order-42")


def staff(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator() -> Client:
    return logged_in(staff("view_idempotencyrecord", "resolve_idempotencyrecord"))


@pytest.fixture
def viewer() -> Client:
    return logged_in(staff("view_idempotencyrecord"))


def changelist(client: Client, **params: str):
    return client.get(reverse(CHANGELIST), params)


def listed(response) -> set[int]:
    return {record.pk for record in response.context["cl"].result_list}


def act(client: Client, action: str, *records: IdempotencyRecord, **extra: object):
    data = {"action": action, "_selected_action": [r.pk for r in records], **extra}
    return client.post(reverse(CHANGELIST), data, follow=True)


def notes(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def reloaded(record: IdempotencyRecord) -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(pk=record.pk)


def change_log(record: IdempotencyRecord) -> list[str]:
    entries = LogEntry.objects.filter(object_id=str(record.pk), action_flag=CHANGE)
    return [entry.get_change_message() for entry in entries]


# -- the list: columns, filters, search


def test_list_shows_the_operator_columns(operator):
    record = IdempotencyRecordFactory(expired_lease=True, idem_key="order-abc")
    response = changelist(operator)
    assert response.status_code == 200
    page = response.content.decode()
    assert "order-abc" in page and record.scope in page
    assert "(expired)" in page  # lease end of a dead worker
    for column in ("column-response_status", "column-attempts", "column-lease_end", "column-age"):
        assert column in page


def test_stuck_filter_finds_expired_leases_and_needs_review_only(operator):
    expired = IdempotencyRecordFactory(expired_lease=True)
    review = IdempotencyRecordFactory(needs_review=True)
    IdempotencyRecordFactory(in_flight=True)
    IdempotencyRecordFactory(succeeded=True)
    IdempotencyRecordFactory(failed_retryable=True)
    assert listed(changelist(operator, stuck="yes")) == {expired.pk, review.pk}


def test_status_filter(operator):
    review = IdempotencyRecordFactory(needs_review=True)
    IdempotencyRecordFactory(succeeded=True)
    assert listed(changelist(operator, status__exact=Status.NEEDS_REVIEW)) == {review.pk}


def test_operation_filter_lists_operations_and_filters(operator):
    orders = IdempotencyRecordFactory(operation="orders.create")
    IdempotencyRecordFactory(operation="payments.charge")
    page = changelist(operator).content.decode()
    assert "?operation=orders.create" in page and "?operation=payments.charge" in page
    assert listed(changelist(operator, operation="orders.create")) == {orders.pk}


def test_age_filter_uses_creation_time(operator):
    old = IdempotencyRecordFactory(created_at=timezone.now() - timedelta(days=2))
    new = IdempotencyRecordFactory()
    assert listed(changelist(operator, age="gt1d")) == {old.pk}
    assert listed(changelist(operator, age="1h")) == {new.pk}
    assert listed(changelist(operator, age="gt7d")) == set()


def test_search_by_exact_key_scope_prefix_and_resource_id(operator):
    target = IdempotencyRecordFactory(
        succeeded=True, idem_key="pay-123", scope="user:42:orders.create", resource_id="R-9"
    )
    IdempotencyRecordFactory(idem_key="pay-1234", scope="user:420:orders.create")
    assert listed(changelist(operator, q="pay-123")) == {target.pk}
    assert listed(changelist(operator, q="user:42:")) == {target.pk}
    assert listed(changelist(operator, q="R-9")) == {target.pk}


def test_the_list_is_newest_first_by_id_with_no_date_hierarchy(operator):
    # No index of created_at for every create to write (migration 0006): the list
    # reads the primary key backwards, and no date hierarchy scans the whole table.
    older, newer = IdempotencyRecordFactory(), IdempotencyRecordFactory()
    page = changelist(operator)
    assert [row.pk for row in page.context["cl"].result_list][:2] == [newer.pk, older.pk]
    assert "created_at__year" not in page.content.decode()


# -- the detail page: readable, bounded, escaped, read-only


def test_detail_page_shows_request_and_pretty_json_response(operator):
    body = json.dumps({"id": 7, "note": "<script>alert(1)</script>"}).encode()
    record = IdempotencyRecordFactory(succeeded=True, response_body=body, request_path="/orders/")
    url = reverse("admin:idempotency_idempotencyrecord_change", args=[record.pk])
    page = operator.get(url).content.decode()
    assert "/orders/" in page and record.request_hash.hex() in page
    assert record.owner_token.hex() in page
    assert "{\n  &quot;id&quot;: 7," in page  # pretty-printed, then escaped
    assert "<script>alert(1)</script>" not in page
    assert "Location: /orders/7/" in page
    assert 'name="_save"' not in page  # nothing to save: view only


def test_readable_body_is_bounded_and_survives_binary():
    huge = json.dumps({"blob": "x" * (BODY_DISPLAY_LIMIT * 2)}).encode()
    text = readable_body(huge, "application/json")
    assert len(text) < BODY_DISPLAY_LIMIT + 100 and "more characters" in text
    assert readable_body(b"\xff\xfe not utf-8", "application/octet-stream").endswith("not utf-8")
    assert readable_body(b"{not json", "application/json") == "{not json"
    assert readable_body(None) == ""


def test_no_add_and_no_edit(operator):
    record = IdempotencyRecordFactory(needs_review=True)
    admin_root = "admin:idempotency_idempotencyrecord"
    assert operator.get(reverse(f"{admin_root}_add")).status_code == 403
    url = reverse(f"{admin_root}_change", args=[record.pk])
    response = operator.post(url, {"status": Status.SUCCEEDED, "resource_id": "forged"})
    assert response.status_code == 403
    assert reloaded(record).status == Status.NEEDS_REVIEW
    assert "addlink" not in changelist(operator).content.decode()


def test_superuser_cannot_edit_either(admin_client):
    record = IdempotencyRecordFactory(needs_review=True)
    url = reverse("admin:idempotency_idempotencyrecord_change", args=[record.pk])
    assert admin_client.post(url, {"status": Status.SUCCEEDED}).status_code == 403
    assert reloaded(record).status == Status.NEEDS_REVIEW


def test_delete_only_settled_records_and_only_with_the_permission(viewer):
    deleter = logged_in(staff("view_idempotencyrecord", "delete_idempotencyrecord"))
    settled = IdempotencyRecordFactory(succeeded=True)
    stuck = IdempotencyRecordFactory(expired_lease=True)
    delete = "admin:idempotency_idempotencyrecord_delete"
    assert viewer.get(reverse(delete, args=[settled.pk])).status_code == 403
    assert deleter.get(reverse(delete, args=[stuck.pk])).status_code == 403
    assert deleter.post(reverse(delete, args=[settled.pk]), {"post": "yes"}).status_code == 302
    assert not IdempotencyRecord.objects.filter(pk=settled.pk).exists()
    assert "delete_selected" not in changelist(deleter).content.decode()


# -- the permission


def test_viewer_without_resolve_permission_has_no_actions(viewer):
    record = IdempotencyRecordFactory(needs_review=True)
    page = changelist(viewer).content.decode()
    assert "release_for_retry" not in page
    response = act(viewer, "release_for_retry", record)
    assert reloaded(record).status == Status.NEEDS_REVIEW
    assert not any("released" in note for note in notes(response))
    assert not change_log(record)


def test_staff_without_view_permission_cannot_list():
    client = logged_in(staff("resolve_idempotencyrecord"))
    assert changelist(client).status_code == 403


def test_detail_page_offers_actions_to_operators_only(operator, viewer):
    record = IdempotencyRecordFactory(needs_review=True)
    url = reverse("admin:idempotency_idempotencyrecord_change", args=[record.pk])
    assert 'id="idempotency-resolve"' in operator.get(url).content.decode()
    assert 'id="idempotency-resolve"' not in viewer.get(url).content.decode()
    settled = IdempotencyRecordFactory(succeeded=True)
    url = reverse("admin:idempotency_idempotencyrecord_change", args=[settled.pk])
    assert 'id="idempotency-resolve"' not in operator.get(url).content.decode()


def test_detail_page_button_runs_the_action(operator):
    record = IdempotencyRecordFactory(needs_review=True)
    response = operator.post(
        reverse(CHANGELIST),
        {"action": "release_for_retry", "_selected_action": record.pk},
        follow=True,
    )
    assert reloaded(record).status == Status.FAILED_RETRYABLE
    assert any("released for retry" in note for note in notes(response))


# -- release for retry


@pytest.mark.parametrize("state", ["expired_lease", "needs_review"])
def test_release_for_retry_allowed(operator, state):
    record = IdempotencyRecordFactory(**{state: True})
    response = act(operator, "release_for_retry", record)
    after = reloaded(record)
    assert after.status == Status.FAILED_RETRYABLE
    assert after.version == record.version + 1 and after.owner_token != record.owner_token
    assert "1 record released for retry" in notes(response)[0]
    assert change_log(record) == [f"Status {record.status} → FAILED_RETRYABLE."]


@pytest.mark.parametrize("state", ["succeeded", "failed_final", "failed_retryable"])
def test_release_for_retry_refused_for_settled_records(operator, state):
    record = IdempotencyRecordFactory(**{state: True})
    response = act(operator, "release_for_retry", record)
    assert reloaded(record).status == record.status
    (note,) = notes(response)
    assert note.startswith("1 record was not changed:")
    assert f"a {record.status} record cannot become FAILED_RETRYABLE" in note
    assert not change_log(record)


def test_release_refused_while_the_lease_is_live(operator):
    record = IdempotencyRecordFactory(in_flight=True)
    response = act(operator, "release_for_retry", record)
    assert reloaded(record).status == Status.PROCESSING
    assert "its lease is still live" in notes(response)[0]


def test_mixed_selection_reports_both(operator):
    good = IdempotencyRecordFactory(needs_review=True)
    bad = IdempotencyRecordFactory(succeeded=True)
    response = act(operator, "release_for_retry", good, bad)
    assert reloaded(good).status == Status.FAILED_RETRYABLE
    assert reloaded(bad).status == Status.SUCCEEDED
    assert len(notes(response)) == 2


# -- mark final failure


@pytest.mark.parametrize("state", ["expired_lease", "needs_review"])
def test_mark_final_failure_allowed(operator, state):
    record = IdempotencyRecordFactory(**{state: True})
    act(operator, "mark_final_failure", record)
    after = reloaded(record)
    assert after.status == Status.FAILED_FINAL and after.completed_at is not None
    assert change_log(record) == [f"Status {record.status} → FAILED_FINAL."]


@pytest.mark.parametrize("state", ["succeeded", "failed_retryable", "in_flight"])
def test_mark_final_failure_refused(operator, state):
    record = IdempotencyRecordFactory(**{state: True})
    response = act(operator, "mark_final_failure", record)
    assert reloaded(record).status == record.status
    assert notes(response)[0].startswith("1 record was not changed:")


# -- mark succeeded, with the intermediate form


def test_mark_succeeded_asks_for_the_resource_id_first(operator):
    record = IdempotencyRecordFactory(needs_review=True)
    response = operator.post(
        reverse(CHANGELIST), {"action": "mark_succeeded", "_selected_action": [record.pk]}
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert f'name="resource_id_{record.pk}"' in page and 'name="apply"' in page
    assert reloaded(record).status == Status.NEEDS_REVIEW  # nothing happens before "apply"


@pytest.mark.parametrize("state", ["expired_lease", "needs_review"])
def test_mark_succeeded_allowed(operator, state):
    record = IdempotencyRecordFactory(**{state: True})
    response = act(
        operator, "mark_succeeded", record, apply="1", **{f"resource_id_{record.pk}": " 991 "}
    )
    after = reloaded(record)
    assert after.status == Status.SUCCEEDED and after.resource_id == "991"
    assert "1 record marked as succeeded" in notes(response)[0]
    assert change_log(record) == [
        f"Status {record.status} → SUCCEEDED. Resource id '' → '991'. "
        "Repeats get status 201, 0 bytes."  # a POST's create, prefilled; no body given
    ]


def test_mark_succeeded_asks_what_repeats_get_and_says_what_clients_see(operator):
    record = IdempotencyRecordFactory(needs_review=True)
    page = operator.post(
        reverse(CHANGELIST), {"action": "mark_succeeded", "_selected_action": [record.pk]}
    ).content.decode()
    for field in ("status", "content_type", "body"):
        assert f'name="{field}_{record.pk}"' in page
    assert f'name="status_{record.pk}" value="201"' in page  # a POST: a create's status
    assert "application/json" in page
    assert "Idempotent-Replayed: true" in page and "empty body" in page


def test_repeats_get_the_status_and_body_the_operator_gave(operator):
    from rest_framework.test import APIClient

    from tests.unit.test_http import ORDER, pending_order

    client = APIClient()
    client.force_authenticate(owner := UserFactory())
    record = pending_order(owner, ORDER, needs_review=True)
    body = '{"id": 991, "sku": "book", "quantity": 2}'
    act(
        operator,
        "mark_succeeded",
        record,
        apply="1",
        **{
            f"resource_id_{record.pk}": "991",
            f"status_{record.pk}": "201",
            f"content_type_{record.pk}": "application/json",
            f"body_{record.pk}": body,
        },
    )
    repeat = client.post("/orders/", ORDER, format="json", headers={"Idempotency-Key": "k-1"})
    assert repeat.status_code == 201
    assert repeat["Content-Type"] == "application/json"
    assert repeat["Idempotent-Replayed"] == "true"
    assert json.loads(repeat.content) == json.loads(body)
    assert "Idempotency-Replay" not in repeat  # given empty or not, never "omitted"
    assert change_log(record)[0].endswith(f"Repeats get status 201, {len(body)} bytes.")


def test_a_blank_body_is_replayed_empty_with_the_status_given(operator):
    from idempotency.response import replay_response

    record = IdempotencyRecordFactory(needs_review=True)
    act(operator, "mark_succeeded", record, apply="1", **{f"status_{record.pk}": "204"})
    replayed = replay_response(reloaded(record))
    assert (replayed.status_code, replayed.content) == (204, b"")
    assert "Idempotency-Replay" not in replayed  # empty as given, not a body left out


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"status": "500"}, "less than or equal to 299"),
        ({"body": "{not json"}, "Not JSON"),
    ],
)
def test_mark_succeeded_form_refuses_what_no_client_could_read(operator, fields, error):
    record = IdempotencyRecordFactory(needs_review=True)
    data = {f"{name}_{record.pk}": value for name, value in fields.items()}
    response = operator.post(
        reverse(CHANGELIST),
        {"action": "mark_succeeded", "_selected_action": [record.pk], "apply": "1", **data},
    )
    assert response.status_code == 200 and error in response.content.decode()
    assert reloaded(record).status == Status.NEEDS_REVIEW


def test_a_tasks_result_must_be_json_whatever_the_content_type(operator):
    # No request method: a task's or function's record, whose repeats return the JSON.
    record = IdempotencyRecordFactory(needs_review=True, request_method="", request_path="")
    data = {f"content_type_{record.pk}": "text/plain", f"body_{record.pk}": "done"}
    response = operator.post(
        reverse(CHANGELIST),
        {"action": "mark_succeeded", "_selected_action": [record.pk], "apply": "1", **data},
    )
    assert response.status_code == 200 and "Not JSON" in response.content.decode()
    assert reloaded(record).status == Status.NEEDS_REVIEW


def test_mark_succeeded_blank_keeps_the_resource_id(operator):
    record = IdempotencyRecordFactory(needs_review=True, resource_id="7")
    act(operator, "mark_succeeded", record, apply="1", **{f"resource_id_{record.pk}": ""})
    assert reloaded(record).resource_id == "7"


@pytest.mark.parametrize("state", ["succeeded", "failed_final", "in_flight"])
def test_mark_succeeded_refused(operator, state):
    record = IdempotencyRecordFactory(**{state: True})
    response = act(
        operator, "mark_succeeded", record, apply="1", **{f"resource_id_{record.pk}": "x"}
    )
    assert reloaded(record).status == record.status
    assert reloaded(record).resource_id == record.resource_id
    assert notes(response)[0].startswith("1 record was not changed:")


def test_mark_succeeded_form_rejects_overlong_resource_ids(operator):
    record = IdempotencyRecordFactory(needs_review=True)
    response = operator.post(
        reverse(CHANGELIST),
        {
            "action": "mark_succeeded",
            "_selected_action": [record.pk],
            "apply": "1",
            f"resource_id_{record.pk}": "x" * 300,
        },
    )
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    assert reloaded(record).status == Status.NEEDS_REVIEW


# -- run the resolver now


@pytest.mark.parametrize("state", ["expired_lease", "needs_review"])
def test_run_resolver_applies_its_answer(operator, settings, state):
    settings.IDEMPOTENCY = {"RESOLVERS": {"tests.operation": RESOLVER}}
    record = IdempotencyRecordFactory(**{state: True})
    response = act(operator, "run_resolver", record)
    after = reloaded(record)
    assert after.status == Status.SUCCEEDED and after.resource_id == "order-42"
    assert "The resolver ran for 1 record (succeeded: 1)." in notes(response)
    assert change_log(record) == [f"Ran the resolver: succeeded ({record.status} → SUCCEEDED)."]


@pytest.mark.parametrize("state", ["expired_lease", "needs_review"])
def test_run_resolver_without_a_resolver_says_there_is_none(operator, state):
    record = IdempotencyRecordFactory(**{state: True}, operation="no.resolver")
    response = act(operator, "run_resolver", record)
    assert reloaded(record).status == record.status
    (note,) = notes(response)
    assert note.startswith("1 record was not changed:")
    assert "operation no.resolver has no resolver" in note
    assert "IDEMPOTENCY['RESOLVERS']['no.resolver']" in note
    # The record may be a function's or a task's, not a view's: each is named.
    assert "@idempotent_function" in note and "IdempotentTask" in note
    assert not change_log(record)


@pytest.mark.parametrize("state", ["succeeded", "failed_retryable", "in_flight"])
def test_run_resolver_refused(operator, settings, state):
    settings.IDEMPOTENCY = {"RESOLVERS": {"tests.operation": RESOLVER}}
    record = IdempotencyRecordFactory(**{state: True})
    response = act(operator, "run_resolver", record)
    assert reloaded(record).status == record.status
    (note,) = notes(response)
    assert note.startswith("1 record was not changed:") and "can be resolved" in note
    assert not change_log(record)


def test_superuser_can_resolve(admin_client):
    record = IdempotencyRecordFactory(needs_review=True)
    act(admin_client, "mark_final_failure", record)
    assert reloaded(record).status == Status.FAILED_FINAL
