from decimal import Decimal

from django.db import migrations, models

#: The seeded GPU type (0002) mirrors EC2 g5.2xlarge: its on-demand list price (Linux,
#: us-east-1) as an example an operator replaces with what they pay. cpu-local runs on the
#: portal's own machine and bills nothing, so it stays unpriced.
SEEDED_PRICES = {"gpu-a10g-1": ("g5.2xlarge", Decimal("1.2120"))}


def price_seeded_types(apps, schema_editor):
    """Only where the type still has its seeded shape: a type an operator changed keeps no
    price until they set one."""
    InstanceType = apps.get_model("deployments", "InstanceType")
    for name, (ec2_type, price) in SEEDED_PRICES.items():
        InstanceType.objects.filter(
            name=name,
            price_per_hour__isnull=True,
            node_selector={"node.kubernetes.io/instance-type": ec2_type},
        ).update(price_per_hour=price)


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0007_instance_type_backends"),
    ]

    operations = [
        migrations.AddField(
            model_name="instancetype",
            name="price_per_hour",
            field=models.DecimalField(
                blank=True,
                decimal_places=4,
                help_text="USD per instance-hour, operator-set; blank: no estimate shown.",
                max_digits=10,
                null=True,
            ),
        ),
        migrations.RunPython(price_seeded_types, migrations.RunPython.noop),
    ]
