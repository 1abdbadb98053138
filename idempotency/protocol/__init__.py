"""The record protocol, read top to bottom: ``operation`` (what runs), ``execute``
(atomic and lease mode, the finish, replays), ``claim`` (the key's record inserted or
found, and what a duplicate of a running attempt is told) and ``states`` (every move of
a record, in one table). It never imports an adapter; the stores never import it, and
write every row it decides.
"""

from idempotency.protocol.operation import Attempt, Operation, bounded_scope

# ``execute`` is imported from its module (``idempotency.protocol.execute``) or from
# ``idempotency``: the package's attribute of that name is the module.
__all__ = ["Attempt", "Operation", "bounded_scope"]
