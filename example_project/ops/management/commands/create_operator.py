"""``manage.py create_operator USERNAME``: a staff account that can resolve idempotency records.

The account is not a superuser: it belongs to the "Idempotency operators" group,
which may view idempotency records and resolve stuck ones in the admin
(``idempotency.resolve_idempotencyrecord``), and nothing else. Running the
command again updates the account and the group; it never demotes a superuser.
"""

from __future__ import annotations

import getpass
import os
from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

GROUP = "Idempotency operators"
PERMISSIONS = ("view_idempotencyrecord", "resolve_idempotencyrecord")
PASSWORD_VARIABLE = "OPERATOR_PASSWORD"


class Command(BaseCommand):
    help = (
        "Create (or update) a staff user who can view idempotency records in the admin and "
        "resolve stuck ones, without being a superuser."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument(
            "--can-delete",
            action="store_true",
            help="Also allow deleting settled records in the admin.",
        )
        parser.add_argument(
            "--no-input",
            "--noinput",
            action="store_false",
            dest="interactive",
            help=f"Read the password from ${PASSWORD_VARIABLE} instead of prompting.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = self.password(options["interactive"])
        with transaction.atomic():
            group = operators_group(options["can_delete"])
            user, created = self.save_user(options["username"], options["email"], password)
            user.groups.add(group)
        verb = "Created" if created else "Updated"
        self.stdout.write(
            self.style.SUCCESS(
                f"{verb} operator {user.get_username()!r}: log in at /admin/ to view and "
                f"resolve idempotency records."
            )
        )

    def password(self, interactive: bool) -> str:
        if not interactive:
            password = os.environ.get(PASSWORD_VARIABLE, "")
            if not password:
                raise CommandError(f"Set ${PASSWORD_VARIABLE} when using --no-input.")
            return password
        password = getpass.getpass("Password: ")
        if not password or password != getpass.getpass("Password (again): "):
            raise CommandError("The passwords were empty or did not match.")
        return password

    def save_user(self, username: str, email: str, password: str) -> tuple[Any, bool]:
        users = get_user_model()._default_manager
        user, created = users.get_or_create(**{get_user_model().USERNAME_FIELD: username})
        user.is_staff = True
        user.is_active = True
        if email:
            user.email = email
        user.set_password(password)
        user.save()
        return user, created


def operators_group(can_delete: bool = False) -> Group:
    group, _ = Group.objects.get_or_create(name=GROUP)
    codenames = PERMISSIONS + (("delete_idempotencyrecord",) if can_delete else ())
    permissions = Permission.objects.filter(
        content_type__app_label="idempotency", codename__in=codenames
    )
    if permissions.count() != len(codenames):
        raise CommandError(
            "Run `manage.py migrate` first: the idempotency permissions are missing."
        )
    group.permissions.add(*permissions)
    return group
