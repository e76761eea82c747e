"""MQTT adapter (aiomqtt): the event publisher and the schema of the cluster agents' reports."""
