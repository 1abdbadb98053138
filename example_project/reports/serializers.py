from __future__ import annotations

from rest_framework import serializers

from example_project.reports.models import Report


class ReportSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    seconds = serializers.FloatField(min_value=0, max_value=30)

    class Meta:
        model = Report
        fields = ["id", "seconds", "created_at"]
        read_only_fields = ["id", "created_at"]
