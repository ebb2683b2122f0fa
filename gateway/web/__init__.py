"""The aiohttp server the front ends share: wiring, listeners, problems, logs, metrics.

Also the gateway's own endpoints (key lookup and resolve, the admin API,
health, metrics, the OpenAPI document), which answer on the same server as
the proxy but are no part of it.
"""
