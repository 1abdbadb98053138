"""Optional integrations, each importable only when its dependency is installed."""
