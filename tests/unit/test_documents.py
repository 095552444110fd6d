"""The documents read from the API server (the assignment, release acknowledgements, a Topic's
spec) and the bounded JSON reader under them: text nested too deep, overlong or overflowing
numbers and bytes that are not UTF-8 are each reader's own error, never another exception."""

from __future__ import annotations

import json

import pytest

from mqbalance.contract import AssignmentDocument, DocumentError, HandoverMode, decode_acks, read_topic_spec
from mqbalance.json_limits import MAX_DEPTH, JsonError, TooDeep, loads
from mqbalance.model import MessageModel
from mqbalance.sidecar import watch
from tests.unit.sidecar.sidecar_support import FakeClock, document, make_config, make_state


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_nested_up_to_the_limit_is_read_and_deeper_is_refused() -> None:
    assert loads(nested(MAX_DEPTH)) is not None
    assert loads(json.dumps({"s": "[" * 1000})) == {"s": "[" * 1000}  # brackets in strings are text
    for deeper in (MAX_DEPTH + 1, 990, 100_000):  # below and above where json itself gives up
        with pytest.raises(TooDeep, match=f"nested deeper than {MAX_DEPTH} levels"):
            loads(nested(deeper))


@pytest.mark.parametrize(
    ("data", "message"),
    [(b'{"a":"\xff"}', "not UTF-8"), ("[" + "9" * 5000 + "]", "Exceeds the limit"), ("{oops", "Expecting")],
)
def test_json_that_cannot_be_read_is_one_error(data: str | bytes, message: str) -> None:
    with pytest.raises(JsonError, match=message):
        loads(data)


GOOD = json.loads(document(3).encode())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (nested(100_000), "nested deeper than 64"),
        ('{"generation":1,"group":"g","strategy":"AVG","computedAt":' + "9" * 400 + "}", "too large"),
        ("[" + "1" * 5000 + "]", "Exceeds the limit"),
        (
            json.dumps({**GOOD, "members": {"p": nested(70)}}).replace('"' + nested(70) + '"', nested(70)),
            "deeper",
        ),
    ],
)
def test_an_unreadable_assignment_is_a_document_error(text: str, message: str) -> None:
    with pytest.raises(DocumentError, match=message):
        AssignmentDocument.decode(text)


def test_the_handover_and_the_message_model_are_read_as_their_types_and_written_as_before() -> None:
    text = json.dumps({**GOOD, "messageModel": "BROADCASTING", "handover": "Orderly"}, sort_keys=True)
    doc = AssignmentDocument.decode(text)
    assert doc.message_model is MessageModel.BROADCASTING
    assert doc.handover is HandoverMode.ORDERLY
    assert doc.encode() == text.replace(": ", ":").replace(", ", ",")  # the same bytes as written
    plain = AssignmentDocument.decode(json.dumps({k: v for k, v in GOOD.items() if k != "messageModel"}))
    assert (plain.message_model, plain.handover) == (MessageModel.CLUSTERING, HandoverMode.OFF)
    assert "handover" not in plain.to_json()


@pytest.mark.parametrize(
    ("field", "value", "names"),
    [("handover", "Eventually", "Off, Release, Orderly"), ("messageModel", None, "CLUSTERING, BROADCASTING")],
)
def test_a_handover_or_message_model_the_contract_does_not_name_is_a_document_error(
    field: str, value: object, names: str
) -> None:
    with pytest.raises(DocumentError, match=f"{field} is {value!r}; expected one of {names}"):
        AssignmentDocument.decode(json.dumps({**GOOD, field: value}))


def test_the_sidecar_keeps_serving_when_its_configmap_turns_unreadable() -> None:
    state = make_state(make_config(groups=("orders",)), FakeClock())
    watch.apply_text(state, "orders", document(3).encode())
    watch.apply_text(state, "orders", nested(100_000))
    served = state.groups["orders"].served
    assert served is not None
    assert served.generation == 3
    assert (
        state.metrics.registry.get_sample_value(
            "mqbalance_sidecar_invalid_documents_total", {"group": "orders"}
        )
        == 1
    )


def test_unreadable_acknowledgements_are_left_out() -> None:
    data = {"a": '{"generation": 4}', "b": nested(100_000), "c": '{"generation": ' + "9" * 5000 + "}"}
    assert {pod: ack.generation for pod, ack in decode_acks(data).items()} == {"a": 4}


def test_a_poll_interval_no_float_holds_is_left_out() -> None:
    spec = read_topic_spec("t", {"nameServer": {"pollSeconds": 10**400}})
    assert spec.name_server is not None
    assert spec.name_server.poll_seconds == 30.0
