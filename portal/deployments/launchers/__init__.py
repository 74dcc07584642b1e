"""Where instances run: local processes (the embedded default) or Kubernetes.

:func:`get_launcher` picks the one ``INSTANCE_LAUNCHER`` names; :func:`version_set` describes a
deployment's instances of one version in the launcher's terms.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

from portal.deployments.launchers.base import Launcher, Shape, VersionSet
from portal.deployments.models import Deployment
from portal.registry.models import ModelVersion
from portal.registry.packaging import packages_dir, triton_model_name, weights_dir

LAUNCHERS = {
    "local": "portal.deployments.launchers.local.LocalLauncher",
    "kubernetes": "portal.deployments.launchers.kubernetes.KubernetesLauncher",
}


def get_launcher() -> Launcher:
    """The launcher ``INSTANCE_LAUNCHER`` names (``local``, ``kubernetes``, or the dotted path
    of another :class:`Launcher`), over the current settings. Cheap to make: a launcher keeps
    no state of its own."""
    kind = settings.INSTANCE_LAUNCHER
    launcher = import_string(LAUNCHERS.get(kind, kind))()
    if not isinstance(launcher, Launcher):
        raise TypeError(f"INSTANCE_LAUNCHER={kind!r} is not a Launcher.")
    return launcher


def version_set(deployment: Deployment, version: ModelVersion) -> VersionSet:
    model = deployment.model
    shape = deployment.instance_type
    return VersionSet(
        deployment_id=deployment.pk,
        team=model.team.slug,
        model=model.slug,
        version=version.number,
        served_model_name=triton_model_name(version),
        package_path=packages_dir() / f"{version.package_digest}.tar",
        package_digest=version.package_digest,
        weights_dir=weights_dir(version),
        shape=Shape(
            name=shape.name,
            gpus=shape.gpus,
            cpus=shape.cpus,
            memory_gib=shape.memory_gib,
            accelerator=shape.accelerator,
            node_selector=dict(shape.node_selector),
            tolerations=list(shape.tolerations),
            engine=shape.engine,
        ),
        image=f"{settings.SERVING_IMAGE_REPOSITORY}:{version.release.name}",
    )
