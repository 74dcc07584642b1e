from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from portal.accounts.models import Role, Team
from portal.accounts.tokens import issue_token


class Command(BaseCommand):
    help = "Issue an API token for a team and print it once."

    def add_arguments(self, parser):
        parser.add_argument("team")
        parser.add_argument("name")
        parser.add_argument("--role", choices=[r.value for r in Role], default=Role.MEMBER)
        parser.add_argument("--days", type=int, default=None, help="Expire after this many days.")

    def handle(self, *args, team: str, name: str, role: str, days: int | None, **options):
        found = Team.objects.filter(slug=team).first()
        if found is None:
            raise CommandError(f"No team {team!r}.")
        expires = timezone.now() + timedelta(days=days) if days else None
        self.stdout.write(
            issue_token(team=found, name=name, role=role, expires_at=expires).plaintext
        )
