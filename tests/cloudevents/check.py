"""Reads back one CloudEvent as a transport delivered it, with the Python reference SDK.

Input (stdin, JSON): {"binding": "http" | "kafka" | "amqp" | "nats" | "mqtt" | "redis" | "sqs",
"headers": [[name, value], ...], "key": "..." (Kafka) , "body_base64": "..."}.
Output (stdout, JSON): {"attributes": {...}, "data": ..., "data_base64": "..."}: what
the SDK made of it, `data` as JSON when the SDK decoded it, else base64.

HTTP and Kafka go through the SDK's own bindings (from_http, kafka.from_binary /
from_structured). The SDK has none for AMQP, NATS, MQTT and SQS/SNS (no SQS binding
exists): there a structured event is read with from_json, and a binary one is rebuilt
from the binding's attribute names (prefix `cloudEvents:`, `ce-`, or none; SQS message
attributes `ce-...` and `content-type`) into the SDK's CloudEvent, which checks the
required attributes and the spec version.
"""

import base64
import json
import sys
from datetime import datetime

from cloudevents.conversion import to_dict
from cloudevents.http import CloudEvent, from_http, from_json
from cloudevents.kafka import KafkaMessage, from_binary, from_structured

STRUCTURED = "application/cloudevents+json"
PREFIXES = {"amqp": "cloudEvents:", "nats": "ce-", "mqtt": "", "sqs": "ce-"}


def text(name, value):
    """An attribute as text; `time` in one spelling (the SDK keeps a string as given)."""
    if name == "time":
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        return value.isoformat()
    return str(value)


def main():
    given = json.load(sys.stdin)
    binding = given["binding"]
    headers = given["headers"]
    body = base64.b64decode(given["body_base64"])
    content_type = next((v for n, v in headers if n.lower() == "content-type"), None)
    if binding == "http":
        event = from_http(dict(headers), body)
    elif binding == "kafka":
        message = KafkaMessage(
            headers={n: v.encode() for n, v in headers},
            key=(given.get("key") or "").encode() or None,
            value=body,
        )
        if content_type == STRUCTURED:
            event = from_structured(message)
        else:
            event = from_binary(message)
    elif binding == "redis" or content_type == STRUCTURED:
        event = from_json(body)
    else:
        prefix = PREFIXES[binding]
        attributes = {
            n[len(prefix):]: v
            for n, v in headers
            if n.startswith(prefix) and n.lower() != "content-type"
        }
        if binding != "mqtt" and "datacontenttype" in attributes:
            raise SystemExit("datacontenttype travels as the content type, not a header")
        if content_type is not None:
            attributes["datacontenttype"] = content_type
        data = body
        if content_type and "json" in content_type:
            data = json.loads(body)
        event = CloudEvent(attributes, data)
    out = {"attributes": {k: text(k, v) for k, v in event.get_attributes().items()}}
    data = event.data
    if isinstance(data, (bytes, bytearray)):
        out["data_base64"] = base64.b64encode(data).decode()
    else:
        out["data"] = data
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
