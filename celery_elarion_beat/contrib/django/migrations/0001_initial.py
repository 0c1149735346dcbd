"""The unmanaged model of the database entries: Django creates no table (beat's schema
has it), only the model's permissions and content type."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="DatabaseEntry",
            fields=[
                ("cluster", models.CharField(max_length=191)),
                ("name", models.CharField(max_length=191, primary_key=True, serialize=False)),
                ("task", models.TextField()),
                ("schedule", models.TextField()),
                ("args", models.TextField()),
                ("kwargs", models.TextField()),
                ("options", models.TextField()),
                ("enabled", models.BooleanField()),
                ("revision", models.BigIntegerField()),
                ("effective_at", models.DateTimeField(null=True)),
                ("updated_at", models.DateTimeField(null=True)),
                ("actor", models.TextField(null=True)),
                ("reason", models.TextField(null=True)),
                ("overrides", models.BooleanField()),
                ("code_digest", models.CharField(max_length=64, null=True)),
                ("restart", models.BooleanField()),
            ],
            options={
                "verbose_name": "database entry",
                "verbose_name_plural": "database entries",
                "db_table": "elarion_scheduler_entries",
                "ordering": ("name",),
                "managed": False,
                "default_permissions": ("add", "change", "delete", "view"),
            },
        ),
    ]
