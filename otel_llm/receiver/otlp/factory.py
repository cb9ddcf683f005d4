"""``receivers.otlp``: OTLP/gRPC and OTLP/HTTP trace export, in a process of its own (in the defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.receiver.otlp.config import OtlpReceiver


@dataclass(frozen=True)
class ReceiverComponent:
    """Its settings; service/processes.py runs the receiver process and its intake log from them."""

    name: str
    config: OtlpReceiver


def create(config: OtlpReceiver, settings: CreateSettings) -> ReceiverComponent:
    return ReceiverComponent(settings.name, config)


FACTORY = Factory("otlp", Kind.RECEIVER, OtlpReceiver, create, in_defaults=True)
