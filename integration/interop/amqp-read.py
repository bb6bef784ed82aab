#!/usr/bin/env python3
"""Reads messages from a RabbitMQ queue with pika (Debian's python3-pika)
at its default settings and prints each as one JSON line: routing key,
properties, headers and body (decoded as UTF-8). Used by
integration/interop_brokers_test.go.

usage: amqp-read.py QUEUE COUNT  (exit 1 when fewer than COUNT arrive in 30 s)
"""
import json
import sys
import time

import pika


def main():
    queue, count = sys.argv[1], int(sys.argv[2])
    # The default parameters: localhost:5672, guest/guest, vhost /.
    conn = pika.BlockingConnection(pika.ConnectionParameters())
    ch = conn.channel()
    got = 0
    deadline = time.monotonic() + 30
    while got < count and time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue=queue, auto_ack=False)
        if method is None:
            time.sleep(0.1)
            continue
        print(json.dumps({
            "routing_key": method.routing_key,
            "exchange": method.exchange,
            "message_id": props.message_id,
            "type": props.type,
            "content_type": props.content_type,
            "delivery_mode": props.delivery_mode,
            "app_id": props.app_id,
            "timestamp": props.timestamp,
            "headers": {k: v.decode() if isinstance(v, bytes) else v for k, v in (props.headers or {}).items()},
            "body": body.decode("utf-8"),
        }), flush=True)
        ch.basic_ack(method.delivery_tag)
        got += 1
    conn.close()
    sys.exit(0 if got >= count else 1)


if __name__ == "__main__":
    main()
