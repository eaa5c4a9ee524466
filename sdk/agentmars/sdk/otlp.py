"""Where OTLP/HTTP traces go, as the usual ``OTEL_*`` variables say, read as
OpenTelemetry's exporters read them. No OpenTelemetry import: the vLLM launcher, which
only passes the URL on (``--otlp-traces-endpoint``), reads it too."""

from __future__ import annotations

import os
from collections.abc import Mapping


def traces_endpoint_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else ``OTEL_EXPORTER_OTLP_ENDPOINT``
    with ``/v1/traces``; None without either, or when the variables ask for no traces
    (``OTEL_TRACES_EXPORTER=none``, ``OTEL_SDK_DISABLED=true``)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    if endpoint := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return endpoint
    if base := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.rstrip("/") + "/v1/traces"
    return None
