"""The Promela model (``model/protocol.pml``) has the code's states and moves, exactly.

Spin checks the model, so the model must be the protocol the code runs: its state
type and its table of moves (the ``SRC_``/``DST_`` defines that ``go()`` checks every
write against) are read here and compared with ``idempotency.protocol.states``. A move
added to the code, or a state, fails this until the model has it too. No Spin needed.
"""

from __future__ import annotations

import re
from pathlib import Path

from idempotency.protocol.states import MOVES, STATES

MODEL = Path(__file__).resolve().parents[3] / "model" / "protocol.pml"
# "#define SRC_claim    (B(ABSENT))": which states the move leaves (SRC) or reaches (DST).
TABLE_LINE = re.compile(r"^#define (SRC|DST)_(\w+)\s+\((.*)\)\s*$", re.MULTILINE)
STATE_TYPE = re.compile(r"^mtype:state = \{([^}]*)\};", re.MULTILINE)
MOVE_MADE = re.compile(r"\bgo\((\w+),\s*(\w+)\)")


def model_text() -> str:
    return MODEL.read_text()


def model_states(text: str) -> tuple[str, ...]:
    (declared,) = STATE_TYPE.findall(text)
    return tuple(name.strip() for name in declared.split(","))


def model_moves(text: str) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    sides: dict[str, dict[str, frozenset[str]]] = {}
    for side, move, states in TABLE_LINE.findall(text):
        sides.setdefault(move, {})[side] = frozenset(re.findall(r"B\((\w+)\)", states))
    return {move: (found["SRC"], found["DST"]) for move, found in sides.items()}


def test_the_model_has_the_codes_states():
    assert model_states(model_text()) == STATES


def test_the_model_has_the_codes_moves_with_their_sources_and_targets():
    code = {name: (move.sources, move.targets) for name, move in MOVES.items()}
    assert model_moves(model_text()) == code


def test_the_model_makes_every_move_and_only_to_its_targets():
    # A move in the table that the model never makes would be checked by nothing.
    text = model_text()
    made: dict[str, set[str]] = {}
    for move, target in MOVE_MADE.findall(text):
        if move != "m":  # the macro's own definition
            made.setdefault(move, set()).add(target)
    assert set(made) == set(MOVES)
    for move, targets in made.items():
        # ``out`` is a variable: settle's and finish's targets are written as constants
        # elsewhere in the same branch, and go() asserts them at run time.
        assert targets - {"out"} <= MOVES[move].targets, move


def test_a_move_added_to_the_code_alone_fails_the_comparison():
    text = model_text()
    code = {name: (move.sources, move.targets) for name, move in MOVES.items()}
    code["reopen"] = (frozenset({"FAILED_FINAL"}), frozenset({"PROCESSING"}))
    assert model_moves(text) != code
    # And the parser reads a move the model adds: the comparison is not vacuous.
    added = text + "\n#define SRC_reopen (B(FAILED_FINAL))\n#define DST_reopen (B(PROCESSING))\n"
    assert model_moves(added) == code
