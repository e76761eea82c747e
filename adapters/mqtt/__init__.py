"""MQTT adapters (aiomqtt): the event publisher and the member-cluster agent."""
