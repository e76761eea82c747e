"""The HTTP skin over the service: routes, errors, forwarding, OpenAPI and the dashboard."""
