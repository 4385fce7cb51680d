"""Adapters for environments written for other ecosystems (docs/interop.md).

Each module adapts one ecosystem to an ordinary `agentrl.Env`, imports its third-party package
only when an env is built, and is named on the command line as "SCHEME:SPEC" (`agentrl.env.SCHEMES`).
Importing this package imports nothing else.
"""
