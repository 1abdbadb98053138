"""Recovery and operator state changes: only the state machine's arrows, optimistic and fenced."""

from __future__ import annotations

import ast
import itertools
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils.module_loading import import_string

import idempotency
from idempotency import models
from idempotency.exceptions import TransitionNotAllowed
from idempotency.models import IdempotencyRecord, Status
from idempotency.outcomes import Recovered, StoredResponse
from idempotency.protocol.states import ABSENT, MOVES, STATES, can_transition, transition
from tests.support.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db

# The state machine's arrows that do not belong to a request's own claim.
EXPECTED = {
    (Status.PROCESSING, Status.SUCCEEDED),
    (Status.PROCESSING, Status.FAILED_RETRYABLE),
    (Status.PROCESSING, Status.FAILED_FINAL),
    (Status.PROCESSING, Status.NEEDS_REVIEW),
    (Status.NEEDS_REVIEW, Status.SUCCEEDED),
    (Status.NEEDS_REVIEW, Status.FAILED_RETRYABLE),
    (Status.NEEDS_REVIEW, Status.FAILED_FINAL),
}
TRAIT = {
    Status.PROCESSING: "expired_lease",
    Status.SUCCEEDED: "succeeded",
    Status.FAILED_RETRYABLE: "failed_retryable",
    Status.FAILED_FINAL: "failed_final",
    Status.NEEDS_REVIEW: "needs_review",
}
REFUSED = sorted(set(itertools.product(Status, Status)) - EXPECTED)


def make(status: Status, **fields: Any) -> IdempotencyRecord:
    return IdempotencyRecordFactory(**{TRAIT[status]: True}, **fields)


def state(record: IdempotencyRecord) -> dict[str, Any]:
    fresh = IdempotencyRecord.objects.get(pk=record.pk)
    values = {f.attname: getattr(fresh, f.attname) for f in fresh._meta.concrete_fields}
    values["response_body"] = bytes(values["response_body"] or b"")
    return values


def outside_a_request() -> set[tuple[str, str]]:
    return {
        (source, target)
        for name in ("recover", "resolve")
        for source in MOVES[name].sources
        for target in MOVES[name].targets
    }


def test_moves_outside_a_request_are_the_design():
    assert outside_a_request() == EXPECTED


def test_the_table_is_the_designs_state_machine():
    arrows = {
        (source, target)
        for move in MOVES.values()
        for source in move.sources
        for target in move.targets
        if source != target
    }
    finished = {Status.SUCCEEDED, Status.FAILED_FINAL, Status.FAILED_RETRYABLE}
    assert arrows == {
        (ABSENT, Status.PROCESSING),
        (ABSENT, Status.SUCCEEDED),
        (ABSENT, Status.FAILED_FINAL),
        (Status.FAILED_RETRYABLE, Status.PROCESSING),
        *((status, Status.PROCESSING) for status in finished if status != Status.FAILED_RETRYABLE),
        *((Status.PROCESSING, status) for status in (*finished, Status.NEEDS_REVIEW)),
        (Status.PROCESSING, ABSENT),
        *((Status.NEEDS_REVIEW, status) for status in finished),
        *((status, ABSENT) for status in finished),
    }
    assert set(STATES) == {ABSENT, *Status.values}


def mover(target: str) -> str:
    return "recover" if target == Status.NEEDS_REVIEW else "resolve"


@pytest.mark.parametrize(("source", "target"), sorted(EXPECTED))
def test_allowed_transitions_apply(source, target):
    record = make(source)
    moved = transition(record, target, move=mover(target))
    assert moved.status == target
    assert moved.version == record.version + 1
    assert moved.owner_token != record.owner_token
    assert moved.lease_until is None


@pytest.mark.parametrize(("source", "target"), REFUSED)
def test_other_transitions_are_refused_and_change_nothing(source, target):
    record = make(source)
    before = state(record)
    assert not can_transition(record, target)
    with pytest.raises(TransitionNotAllowed):
        transition(record, target)
    assert state(record) == before


def test_succeeded_with_resource_and_response():
    record = make(Status.NEEDS_REVIEW)
    response = StoredResponse(201, [("Location", "/orders/5/")], b'{"id": 5}')
    moved = transition(record, Status.SUCCEEDED, resource_id="5", response=response)
    assert moved.resource_id == "5"
    assert moved.response_status == 201
    assert moved.response_headers == [["Location", "/orders/5/"]]
    assert bytes(moved.response_body) == b'{"id": 5}'
    assert moved.completed_at is not None


def test_resource_id_is_bounded():
    moved = transition(make(Status.NEEDS_REVIEW), Status.SUCCEEDED, resource_id="r" * 300)
    assert moved.resource_id == "r" * 255


def test_response_is_kept_when_not_given():
    record = make(Status.NEEDS_REVIEW, response_status=None)
    moved = transition(record, Status.FAILED_RETRYABLE)
    assert moved.response_status is None
    assert moved.completed_at is None


@override_settings(IDEMPOTENCY={"RETENTION": {"SUCCEEDED": 600, "FAILED_RETRYABLE": 60}})
@pytest.mark.parametrize(
    ("target", "window"),
    [(Status.SUCCEEDED, timedelta(minutes=10)), (Status.FAILED_RETRYABLE, timedelta(minutes=1))],
)
def test_retention_of_the_target_state(target, window):
    moved = transition(make(Status.NEEDS_REVIEW), target)
    assert moved.expires_at - moved.updated_at == pytest.approx(window, abs=timedelta(seconds=2))


def test_needs_review_never_expires():
    record = make(Status.PROCESSING, expires_at=None)
    assert transition(record, Status.NEEDS_REVIEW, move="recover").expires_at is None


class TestGuards:
    def test_live_lease_is_never_overtaken(self):
        record = IdempotencyRecordFactory(in_flight=True)
        before = state(record)
        with pytest.raises(TransitionNotAllowed, match="lease"):
            transition(record, Status.FAILED_RETRYABLE)
        assert state(record) == before

    def test_expired_lease_can_be_resolved(self):
        record = IdempotencyRecordFactory(expired_lease=True)
        assert transition(record, Status.SUCCEEDED, resource_id="9").resource_id == "9"

    def test_stale_version_is_refused(self):
        record = make(Status.NEEDS_REVIEW)
        stale = IdempotencyRecord.objects.get(pk=record.pk)
        transition(record, Status.FAILED_RETRYABLE)
        current = state(record)
        with pytest.raises(TransitionNotAllowed):
            transition(stale, Status.SUCCEEDED)
        assert state(record) == current

    def test_concurrent_operator_edit_is_refused(self):
        record = make(Status.NEEDS_REVIEW)
        IdempotencyRecord.objects.filter(pk=record.pk).update(version=record.version + 1)
        with pytest.raises(TransitionNotAllowed):
            transition(record, Status.FAILED_FINAL)
        assert state(record)["status"] == Status.NEEDS_REVIEW

    def test_changed_status_is_refused_even_with_same_version(self):
        record = make(Status.NEEDS_REVIEW)
        IdempotencyRecord.objects.filter(pk=record.pk).update(status=Status.SUCCEEDED)
        with pytest.raises(TransitionNotAllowed):
            transition(record, Status.FAILED_RETRYABLE)

    def test_transition_fences_the_old_owner(self):
        record = IdempotencyRecordFactory(expired_lease=True)
        old_owner = record.owner_token
        transition(record, Status.FAILED_RETRYABLE)
        # The worker that held the lease writes only WHERE owner_token = its token.
        assert not IdempotencyRecord.objects.filter(
            pk=record.pk, owner_token=old_owner, status=Status.PROCESSING
        ).exists()

    def test_two_transitions_from_one_read_apply_once(self):
        record = make(Status.NEEDS_REVIEW)
        first = IdempotencyRecord.objects.get(pk=record.pk)
        second = IdempotencyRecord.objects.get(pk=record.pk)
        transition(first, Status.SUCCEEDED, resource_id="1")
        with pytest.raises(TransitionNotAllowed):
            transition(second, Status.FAILED_FINAL)
        assert state(record)["status"] == Status.SUCCEEDED
        assert state(record)["resource_id"] == "1"


def test_the_docs_state_diagram_is_the_table():
    # docs/concepts.md draws each move as arrows labelled "<move>, <why>".
    text = (Path(__file__).resolve().parents[3] / "docs" / "concepts.md").read_text()
    diagram = text[text.index("stateDiagram-v2") : text.index("```", text.index("stateDiagram-v2"))]
    arrow = re.compile(r"^\s*(\[\*\]|\w+) --> (\[\*\]|\w+): (\w+),", re.MULTILINE)
    drawn = {
        (move, ABSENT if source == "[*]" else source, ABSENT if target == "[*]" else target)
        for source, target, move in arrow.findall(diagram)
    }
    table = {
        (name, source, target)
        for name, move in MOVES.items()
        for source in move.sources
        for target in move.targets
    }
    assert drawn == table


@pytest.mark.parametrize("name", sorted(MOVES))
def test_each_move_names_the_code_that_makes_it(name):
    module_path, _, attribute_path = MOVES[name].runs.partition(".Store.")
    if attribute_path:  # a store method: the interface every store implements
        owner = import_string(f"{module_path}.Store")
        assert callable(getattr(owner, attribute_path))
    else:
        assert callable(import_string(MOVES[name].runs))


def test_each_set_of_states_has_one_home():
    # The protocol, the stores, the replay cache and the checks all read models' sets.
    package = Path(idempotency.__file__).resolve().parent
    for path in package.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = {target.id for target in targets if isinstance(target, ast.Name)}
            assert not names & {"REPLAYABLE", "PURGEABLE"} or path.name == "models.py", path
    assert set(models.REPLAYABLE) == MOVES["finish"].targets
    assert set(models.PURGEABLE) == MOVES["purge"].sources


def test_recoverys_outcomes_have_one_name_each():
    assert {str(outcome) for outcome in Recovered} == {
        "succeeded",
        "released",
        "needs_review",
        "unknown",
        "skipped",
    }
    assert all(isinstance(outcome, str) for outcome in Recovered)  # a signal's receivers compare
