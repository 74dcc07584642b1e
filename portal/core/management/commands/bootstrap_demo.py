"""Create the embedded default's demo data: a team, an admin who belongs to it, and an API token.

Safe to run again: existing rows are kept; a fresh token is issued only when asked or when the
demo team has none that is still active.
"""

from __future__ import annotations

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from portal.accounts.models import ApiToken, Membership, Role, Team
from portal.accounts.tokens import issue_token


class Command(BaseCommand):
    help = "Create a demo team, an admin user and an API token for the local platform."

    def add_arguments(self, parser):
        parser.add_argument("--username", default=os.environ.get("PORTAL_ADMIN_USER", "admin"))
        parser.add_argument("--password", default=os.environ.get("PORTAL_ADMIN_PASSWORD", "admin"))
        parser.add_argument("--team", default="demo")
        parser.add_argument(
            "--new-token", action="store_true", help="Issue a new token even if one exists."
        )

    @transaction.atomic
    def handle(self, *args, username: str, password: str, team: str, new_token: bool, **options):
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(password)
            user.save()
        demo, _ = Team.objects.get_or_create(slug=team, defaults={"name": "Demo team"})
        Membership.objects.get_or_create(team=demo, user=user, defaults={"role": Role.MEMBER})

        active = [t for t in ApiToken.objects.filter(team=demo, name="demo-ci") if t.is_active]
        token_text = None
        if new_token or not active:
            token_text = issue_token(team=demo, name="demo-ci", created_by=user).plaintext
            self._write_token_file(token_text)

        self.stdout.write(self.style.SUCCESS("Demo ready."))
        self.stdout.write(
            f"  Admin:  user {username!r}"
            + (f", password {password!r}" if created else " (existing)")
        )
        self.stdout.write(f"  Team:   {demo.slug}")
        if token_text:
            self.stdout.write(
                f"  Token:  {token_text}  (also saved to var/demo-token, shown only now)"
            )
        else:
            self.stdout.write(
                "  Token:  an active demo-ci token exists (see var/demo-token); --new-token issues another"
            )

    def _write_token_file(self, token_text: str) -> None:
        from django.conf import settings

        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        path = settings.VAR_DIR / "demo-token"
        path.write_text(token_text + "\n")
        path.chmod(0o600)
