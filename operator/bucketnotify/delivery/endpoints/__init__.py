"""Push endpoints (HTTP, AMQP 0.9.1, Kafka) behind one interface.

Adapters: the only code that talks to the brokers. They map driver errors to our own.
"""

__all__: list[str] = []
