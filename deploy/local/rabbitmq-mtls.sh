#!/usr/bin/env bash
# The second RabbitMQ node, whose AMQPS listener requires a client certificate: see
# rabbitmq.sh (RABBITMQ_MTLS). start|restart|stop|status|install as there.
RABBITMQ_MTLS=1 exec bash "$(dirname "$0")/rabbitmq.sh" "$@"
