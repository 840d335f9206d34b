"""The Kafka wire format: request and response bodies from Kafka's JSON message specs
(``codec``) and record batches v2 (``records``). Pure functions; no I/O."""
