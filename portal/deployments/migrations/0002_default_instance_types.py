from django.db import migrations

INSTANCE_TYPES = [
    {
        "name": "cpu-local",
        "description": "A CPU process on the portal's own machine (embedded default).",
        "accelerator": "",
        "gpus": 0,
        "cpus": 2,
        "memory_gib": 4,
        "node_selector": {},
        "tolerations": [],
    },
    {
        "name": "gpu-a10g-1",
        "description": "One NVIDIA A10G (24 GiB), e.g. EC2 g5.2xlarge.",
        "accelerator": "nvidia-a10g",
        "gpus": 1,
        "cpus": 8,
        "memory_gib": 32,
        "node_selector": {"node.kubernetes.io/instance-type": "g5.2xlarge"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
]


def seed(apps, schema_editor):
    InstanceType = apps.get_model("deployments", "InstanceType")
    for spec in INSTANCE_TYPES:
        InstanceType.objects.get_or_create(name=spec["name"], defaults=spec)


class Migration(migrations.Migration):
    dependencies = [("deployments", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
