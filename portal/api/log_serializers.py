"""The instance log endpoint's query and answer (kept apart from :mod:`.serializers`, which
every other endpoint shares)."""

from __future__ import annotations

from rest_framework import serializers

from portal.deployments.runtime.launchers.base import LOG_CHUNK_LINES, LOG_DEFAULT_TAIL


class LogQuery(serializers.Serializer):
    since = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=64,
        help_text="The `next` of the previous answer: only lines after it. Without it, the "
        "last `tail` lines.",
    )
    follow = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Wait up to 20 s for new lines before answering (a bounded long poll).",
    )
    tail = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=LOG_CHUNK_LINES,
        default=LOG_DEFAULT_TAIL,
        help_text="Without `since`: how many of the last lines.",
    )


class LogOut(serializers.Serializer):
    lines = serializers.ListField(
        child=serializers.CharField(allow_blank=True),
        help_text="At most 2,000 lines (256 KiB); structured lines shown as "
        "`time level logger: message`.",
    )
    next = serializers.CharField(help_text="Pass as `since` to read on from here.")
    ended = serializers.BooleanField(
        help_text="The instance is gone and these lines reach the end of its log."
    )
