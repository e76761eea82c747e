"""The member-cluster agent (``fedbroker agent``): reports its cluster's capacity over MQTT
(``capacity``) and, in pull mode, carries out the broker's signed commands in it
(``commands``) under its own policy (``policy``, ``config``)."""
