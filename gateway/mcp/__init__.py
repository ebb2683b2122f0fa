"""The MCP front end: Model Context Protocol tool calls, with the HTTP routes' guarantees.

A route with `kind = "mcp"` fronts an MCP server over Streamable HTTP. This
package reads JSON-RPC, tells a protected `tools/call` from everything else,
and translates between the protocol and the engine; the engine claims,
sends and records as it does for HTTP routes.
"""
