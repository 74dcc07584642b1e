"""Where instances run: local processes (the embedded default) or Kubernetes.

:func:`get_launcher` makes the launcher of a region (``INSTANCE_LAUNCHER`` unless the region
names another); :func:`version_set` describes a deployment's instances of one version in the
launcher's terms.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.utils.module_loading import import_string

from portal.deployments.models import Deployment, Region
from portal.deployments.runtime import regional_cache
from portal.deployments.runtime.launchers.base import Launcher, RegionConfig, Shape, VersionSet
from portal.registry.models import ModelVersion
from portal.registry.packaging import triton_model_name, weights_dir

LAUNCHERS = {
    "local": "portal.deployments.runtime.launchers.local.LocalLauncher",
    "kubernetes": "portal.deployments.runtime.launchers.kubernetes.KubernetesLauncher",
}


def get_launcher(region: Region | None = None) -> Launcher:
    """The launcher of ``region`` (None: the platform's settings alone, as in the default
    region): the one it names, else ``INSTANCE_LAUNCHER`` (``local``, ``kubernetes``, or the
    dotted path of another :class:`Launcher`). Cheap to make: a launcher keeps no state of its
    own."""
    kind = (region.launcher if region is not None else "") or settings.INSTANCE_LAUNCHER
    launcher = import_string(LAUNCHERS.get(kind, kind))(region_config(region))
    if not isinstance(launcher, Launcher):
        raise TypeError(f"Launcher {kind!r} is not a Launcher.")
    return launcher


def region_config(region: Region | None) -> RegionConfig:
    """The region's launcher settings with its blanks filled from the platform's (None: the
    platform's own, which is what the default region's blanks mean)."""
    if region is None:
        return RegionConfig(
            name="",
            run_root=settings.INSTANCE_RUN_ROOT,
            gateway_prefix=settings.GATEWAY_REDIS_PREFIX,
            kubernetes_namespace=settings.KUBERNETES_NAMESPACE,
        )
    run_root = (
        Path(region.run_directory)
        if region.run_directory
        else settings.INSTANCE_RUN_ROOT
        if region.is_default
        else settings.INSTANCE_RUN_ROOT / "regions" / region.name
    )
    return RegionConfig(
        name=region.name,
        run_root=run_root,
        gateway_prefix=region.gateway_prefix,
        kubernetes_context=region.kubernetes_context,
        kubernetes_namespace=region.kubernetes_namespace or settings.KUBERNETES_NAMESPACE,
    )


def version_set(deployment: Deployment, version: ModelVersion) -> VersionSet:
    model = deployment.model
    shape = deployment.instance_type
    return VersionSet(
        deployment_id=deployment.pk,
        team=model.team.slug,
        model=model.slug,
        version=version.number,
        served_model_name=triton_model_name(version),
        package_path=regional_cache.package_path(deployment.region, version),
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
