"""An index that is partial where the database has partial indexes, composite elsewhere.

PostgreSQL and SQLite index only the rows a scan can match (``WHERE status =
'PROCESSING'``). MySQL and MariaDB have no partial indexes: a plain ``Index``
with a ``condition`` is built there without it, and Django warns ``models.W037``.
``PartialIndex`` says what replaces the condition on those databases (the
condition's column leading a composite index), so every database gets an index
that serves the same scan and no warning is left to silence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


class PartialIndex(models.Index):
    """``fields`` where ``where`` holds where partial indexes exist, else ``fallback_fields``.

    The ``Index`` itself describes the fallback (it has no ``condition``, so
    the system check has nothing to warn about); the partial form is built only
    by a schema editor whose database supports it.
    """

    def __init__(
        self,
        *,
        fields: Sequence[str],
        where: models.Q,
        fallback_fields: Sequence[str],
        name: str,
    ) -> None:
        super().__init__(fields=list(fallback_fields), name=name)
        self.partial_fields = list(fields)
        self.where = where

    def partial(self) -> models.Index:
        return models.Index(fields=self.partial_fields, condition=self.where, name=self.name)

    def create_sql(
        self,
        model: type[models.Model],
        schema_editor: BaseDatabaseSchemaEditor,
        using: str = "",
        **kwargs: Any,
    ) -> Any:
        if schema_editor.connection.features.supports_partial_indexes:
            return self.partial().create_sql(model, schema_editor, using, **kwargs)
        return super().create_sql(model, schema_editor, using, **kwargs)

    def deconstruct(self) -> Any:
        path, _, _ = super().deconstruct()
        kwargs = {
            "fields": self.partial_fields,
            "where": self.where,
            "fallback_fields": list(self.fields),
            "name": self.name,
        }
        return path, (), kwargs
