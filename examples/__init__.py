"""Runnable examples: a tool API to put behind the gateway, and agent demos."""
