"""Where a version's weights live in the model cache: one rule shared by the copy (which writes
them there) and packaging (which points ``model.json`` at them)."""

from __future__ import annotations

from portal.registry.models import ModelVersion


def tree_for(version: ModelVersion) -> str:
    """The version's tree, relative to ``MODEL_CACHE_ROOT``."""
    model = version.model
    return f"models/{model.team.slug}/{model.slug}/{version.number}"
