"""The HTTP reverse-proxy front end: a caller's request in, the engine's reply out.

Routing a path to its upstream, guarding methods, reading bodies within their
limits and turning a request into the engine's `ProxyRequest` belong here;
deciding what happens to the key does not (that is `gateway.engine`).
"""
